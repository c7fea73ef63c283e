"""batch_status / batch_object: OpenAI's statuses from the job's and the batch's state."""

import pytest

from api.batch_view import batch_object, batch_status
from jobs.api_batches import BatchRecord
from jobs.records import JobProgress
from jobs.status import JobStatus


def record(**changes) -> BatchRecord:
    values = dict(id="batch_" + "0" * 32, key_id="key_1", job_id="j", endpoint="/v1/chat/completions",
                  model="smollm2", input_file_id="file-" + "0" * 24, completion_window="24h", num_requests=4,
                  created_at=1000.0)
    return BatchRecord(**{**values, **changes})


def job(status: JobStatus, **changes) -> JobProgress:
    return JobProgress(**{"job_id": "j", "status": status, "rows_total": 8, "rows_succeeded": 4, "rows_failed": 2,
                          "created_at": 1000.0, "started_at": 1001.0, "finished_at": 1009.0, **changes})


@pytest.mark.parametrize("job_status, settled, cancelling, expected", [
    (JobStatus.QUEUED, False, False, "validating"),
    (JobStatus.RUNNING, False, False, "in_progress"),
    (JobStatus.RUNNING, False, True, "cancelling"),
    (JobStatus.FINALIZING, False, False, "finalizing"),
    (JobStatus.SUCCEEDED, False, False, "finalizing"),
    (JobStatus.SUCCEEDED, True, False, "completed"),
    (JobStatus.CANCELLED, False, True, "cancelling"),
    (JobStatus.CANCELLED, True, True, "cancelled"),
    (JobStatus.EXPIRED, False, False, "finalizing"),
    (JobStatus.EXPIRED, True, False, "expired"),
    (JobStatus.FAILED, True, False, "failed"),
])
def test_status(job_status, settled, cancelling, expected):
    batch = record(settled_at=1010.0 if settled else None, cancelling_at=1005.0 if cancelling else None)
    assert batch_status(batch, job(job_status)) == expected


def test_a_refused_batch_is_failed_with_its_errors_and_no_job():
    errors = [{"code": "invalid_json_line", "message": "x", "param": None, "line": 2}]
    batch = batch_object(record(job_id=None, errors=errors, settled_at=1000.0), None, 86_400)
    assert (batch["status"], batch["failed_at"], batch["errors"]) == ("failed", 1000, {"object": "list", "data": errors})


def test_request_counts_scale_rows_to_lines_until_settled():
    running = batch_object(record(), job(JobStatus.RUNNING), 86_400)
    assert running["request_counts"] == {"total": 4, "completed": 2, "failed": 1}
    settled = batch_object(record(settled_at=1010.0, num_completed=3, num_failed=1,
                                  usage={"input_tokens": 30, "output_tokens": 12}), job(JobStatus.SUCCEEDED), 60)
    assert settled["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert running["usage"] is None and settled["usage"] == {
        "input_tokens": 30, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42}
    assert (settled["completed_at"], settled["expires_at"], settled["in_progress_at"]) == (1010, 1060, 1001)

"""`barge submit --input batch.jsonl`: an OpenAI batch file run as a job from the command
line, with no server and no key, and its answers written as OpenAI's output JSONL.

    OUTPUT/requests.parquet     the file's requests (api.batch_store), the job's input
    OUTPUT/part-*.parquet ...   the job's own output
    OUTPUT/output.jsonl         one line per request that succeeded (api.batch_output)
    OUTPUT/errors.jsonl         Barge's failed rows; OUTPUT/output_errors.jsonl: the failed requests
"""

from __future__ import annotations

import json
import time

from api.batch_adapters import served_adapters
from api.batch_input import ENDPOINT_MODES, SCORE_ENDPOINTS, BatchRequests, LineError, parse_batch
from api.json_lines import NotJson, load_line, physical_lines, shown
from api.batch_output import BatchOutput, batch_output
from api.batch_store import read_requests, write_requests
from jobs.api_batches import owes_partial_manifest
from jobs.client import Client, Job
from jobs.settings import Settings
from jobs.spec import JobSpec, JobSpecError
from jobs.status import JobStatus
from storage.fs import resolve
from storage.manifest import is_committed, read_results
from storage.redaction import redact_text
from storage.write import write_bytes_atomic

OUTPUT_NAME = "output.jsonl"
ERROR_OUTPUT_NAME = "output_errors.jsonl"
MAX_ERRORS_SHOWN = 5
PARTIAL_MANIFEST_WAIT_S = 60.0


def is_openai_input(inputs: list[str], input_format: str | None) -> bool:
    return input_format == "openai" or (input_format is None and len(inputs) == 1 and inputs[0].endswith(".jsonl"))


def check_jsonl(source: str, settings: Settings | None = None) -> BatchRequests:
    """Every line of the file checked as the API checks it (a line's adapter against this
    host's BARGE_LORA_MODULES and `settings`, by default this environment's); JobSpecError
    naming the first bad lines."""
    from api.service import served_models, served_widths
    fs, path = resolve(source)
    data = fs.cat_file(path)
    known_models = served_models()
    adapters = served_adapters(settings or Settings.from_env())
    parsed = parse_batch(data, _endpoint(data), known_models, served_widths(known_models), adapters)
    if isinstance(parsed, list):
        raise JobSpecError("input", _describe(parsed))
    return parsed


def describe_requests(parsed: BatchRequests) -> str:
    """What `barge submit --dry-run` shows for an OpenAI batch file."""
    # a score job's rows have no params of their own (api.batch_input.PAIR_COLUMN_PARAMS)
    distinct = {json.dumps(params, sort_keys=True) for params in parsed.row_params
                if parsed.endpoint not in SCORE_ENDPOINTS}
    per_row = f" ({len(distinct)} distinct sets of per-line params)" if distinct else ""
    adapters = sorted(set(parsed.line_models) - {parsed.model})
    on_adapters = f"; lines naming adapters: {', '.join(adapters)}" if adapters else ""
    return (f"{parsed.num_lines} requests ({len(parsed.row_inputs)} rows) to {parsed.endpoint}; the job: mode "
            f"{ENDPOINT_MODES[parsed.endpoint]}, model {parsed.model!r}, params {parsed.params}{per_row}{on_adapters}")


def submit_jsonl(client: Client, source: str, output: str, **spec_fields) -> Job:
    """Check the file, store its requests as the job's Parquet input in OUTPUT, and submit the job."""
    if spec_fields.get("if_exists", "error") == "error" and is_committed(output):
        raise JobSpecError("output", f"{output} already holds a committed result (_SUCCESS); choose another output "
                                     "or submit with if_exists='replace'")
    parsed = check_jsonl(source, client.settings)
    spec = JobSpec(mode=ENDPOINT_MODES[parsed.endpoint], model=parsed.model, input=write_requests(output, parsed),
                   output=output, input_column="input", params=parsed.params,
                   metadata={"openai_endpoint": parsed.endpoint}, **spec_fields)
    return client.submit(spec)


def write_jsonl_output(job: Job) -> BatchOutput:
    """A finished job's OUTPUT/output.jsonl and output_errors.jsonl."""
    state = job.status()
    spec = job.client.store.get_job(job.id).spec
    _wait_for_partial_manifest(job)
    requests = read_requests(spec.output)
    results: list[dict | None] = [None] * len(requests.row_lines)
    if state.status == JobStatus.SUCCEEDED or state.rows_done:
        for row in read_results(spec.output, partial=state.status != JobStatus.SUCCEEDED).to_pylist():
            results[row["row_index"]] = row
    reason = redact_text(state.error) if state.status == JobStatus.FAILED else None   # as the API's batches
    made = batch_output(spec.metadata["openai_endpoint"], spec.model, requests, results, str(state.status), reason)
    for name, lines in ((OUTPUT_NAME, made.output_lines), (ERROR_OUTPUT_NAME, made.error_lines)):
        write_bytes_atomic(spec.output, name, "".join(line + "\n" for line in lines).encode())
    return made


def _wait_for_partial_manifest(job: Job) -> None:
    """An unfinished job lists what it committed a moment after it ends (queueing.finalize)."""
    deadline = time.monotonic() + PARTIAL_MANIFEST_WAIT_S
    while owes_partial_manifest(job.client.store.engine, job.id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job.id}: its partial manifest is still not written after "
                               f"{PARTIAL_MANIFEST_WAIT_S:g} s; run this again later")
        time.sleep(0.5)


def _endpoint(data: bytes) -> str:
    """The url of the file's first request (every line must name the same, parse_batch checks)."""
    for number, line in physical_lines(data.decode("utf-8", errors="replace")):
        try:
            url = load_line(line).get("url")
        except (NotJson, AttributeError):
            break
        if url in ENDPOINT_MODES:
            return url
        raise JobSpecError("input", f"line {number}: url {shown(url)} is not one of {', '.join(ENDPOINT_MODES)}")
    raise JobSpecError("input", "the first request is not a JSON object with a url")


def _describe(errors: list[LineError]) -> str:
    shown = "; ".join(_described(error) for error in errors[:MAX_ERRORS_SHOWN])
    more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
    return shown + more


def _described(error: LineError) -> str:
    """E.g. "line 3: invalid_value (body.model): ..."."""
    where = f"line {error.line}: " if error.line else ""
    param = f" ({error.param})" if error.param else ""
    return f"{where}{error.code}{param}: {error.message}"

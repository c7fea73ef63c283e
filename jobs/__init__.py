"""Barge's job domain: specs, states, the SQL store, the client and its messaging port
(the command line is cli/, on the floor above)."""

from jobs.spec import JobSpec, JobSpecError
from jobs.status import JobStatus, ShardStatus
from jobs.client import Client, Job, JobFailed

__all__ = ["Client", "Job", "JobFailed", "JobSpec", "JobSpecError", "JobStatus", "ShardStatus"]

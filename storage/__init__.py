"""Barge's bytes at rest: list inputs, plan shards from footers, stream a shard's
rows, write part files atomically, commit and read back a job's output.

Everything goes through fsspec (local paths, file://, s3://, memory://, ...);
`storage` imports nothing else of Barge's.
"""

from storage.errors import InputError, OutputError, StorageError
from storage.errors_file import ErrorsFileInfo, read_errors_file, write_errors_file
from storage.fs import describe, redact, resolve
from storage.manifest import (Manifest, commit_output, decode_schema, encode_schema, is_committed,
                              read_errors, read_manifest, read_results)
from storage.plan import InputFile, InputInfo, ShardPlan, inspect_input, plan_shards
from storage.read import read_shard
from storage.schemas import output_schema
from storage.write import PartInfo, check_writable, part_name, write_part

__all__ = [
    "InputError", "OutputError", "StorageError", "ErrorsFileInfo", "read_errors_file", "write_errors_file", "describe", "redact", "resolve",
    "Manifest", "commit_output", "decode_schema", "encode_schema", "is_committed", "read_errors", "read_manifest", "read_results",
    "InputFile", "InputInfo", "ShardPlan", "inspect_input", "plan_shards",
    "read_shard", "output_schema", "PartInfo", "check_writable", "part_name", "write_part",
]

"""The storage error hierarchy: one base, one class per side of the job.

Messages name the file or URL and the problem, so a user can fix the input
without reading a traceback. They never contain credentials.
"""


class StorageError(Exception):
    """Base of every error raised by `storage`."""


class InputError(StorageError):
    """The job's input cannot be used: no files, not Parquet, wrong columns, ..."""


class OutputError(StorageError):
    """The job's output cannot be written, committed or read back."""

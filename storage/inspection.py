"""Submit's inspection of the input, kept with the job, so planning need not read the footers again.

Submit reads every footer (and the id column) to check the job; planning needs exactly
what that found. Kept as JSON in the job's staging folder (storage.stage), it is
removed with the staged files when the output is committed. Planning reads it instead
of the footers; without it (an older client, a local input, a write that failed)
planning inspects the input again, as it always did.

NOTE: planning trusts the kept inspection: a file changed between submit and planning
is found by the shard that reads it (storage.read names it), as a file changed after
planning always was.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from storage.errors import StorageError
from storage.fs import join, redact, resolve
from storage.ids import IdSummary
from storage.inputs import InputFile, InputInfo
from storage.manifest import decode_schema, encode_schema
from storage.write import write_bytes_atomic

log = logging.getLogger("barge.storage")

INSPECTION_NAME = "input.json"


def inspection_to_dict(info: InputInfo) -> dict:
    ids = None
    if info.ids is not None:
        ids = dict(asdict(info.ids), first_duplicates=[[value, list(rows)] for value, rows in info.ids.first_duplicates])
    return {"schema": encode_schema(info.schema), "num_rows": info.num_rows, "work_unit": info.work_unit,
            "partition_keys": list(info.partition_keys), "ids": ids,
            "files": [dict(asdict(f), row_group_rows=list(f.row_group_rows), row_group_work=list(f.row_group_work),
                           row_work=list(f.row_work)) for f in info.files]}


def inspection_from_dict(data: dict) -> InputInfo:
    files = tuple(InputFile(**dict(f, row_group_rows=tuple(f["row_group_rows"]), row_group_work=tuple(f["row_group_work"]),
                                   row_work=tuple(f.get("row_work", ())))) for f in data["files"])
    ids = data["ids"]
    if ids is not None:
        ids = IdSummary(**dict(ids, first_duplicates=tuple((value, tuple(rows))
                                                           for value, rows in ids["first_duplicates"])))
    return InputInfo(files=files, schema=decode_schema(data["schema"]), num_rows=data["num_rows"],
                     work_unit=data["work_unit"], partition_keys=tuple(data["partition_keys"]), ids=ids)


def save_inspection(info: InputInfo, staging: str, storage_options: dict | None = None) -> None:
    """Raises OutputError when it cannot be written. Ids that JSON cannot hold are written as text
    (only the counts matter after submit)."""
    data = json.dumps(inspection_to_dict(info), default=str).encode()
    write_bytes_atomic(staging, INSPECTION_NAME, data, storage_options)


def load_inspection(staging: str, storage_options: dict | None = None) -> InputInfo | None:
    """The kept inspection, or None when there is none (or it cannot be read: planning inspects again)."""
    url = join(staging, INSPECTION_NAME)
    try:
        fs, path = resolve(url, storage_options)
        return inspection_from_dict(json.loads(fs.cat_file(path)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, StorageError) as error:
        log.warning("%s: cannot use the kept inspection, reading the footers again (%s)", redact(url), error)
        return None

"""`--dist loadgroup` for make test: each test goes to whichever xdist process is free, but
all the tests of one `xdist_group` go to one process (tests/conftest.py groups the tests that
share a module's setup).

pytest-xdist's own loadgroup tells its scheduler a test's group by appending "@group" to the
test's node id in the worker; pytest 9.2 computes node ids from a structured id, so the
change no longer shows and the tests are spread as if unmarked, silently
(pytest-dev/pytest-xdist#1386). Here the controller names a folder (in each worker's
workerinput), each worker writes the groups of the tests it collected there, and the
scheduler (pytest-xdist's loadscope scheduler, one work unit per group and one per
ungrouped test, the largest units first) reads them before it hands out any test."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

KEY = "barge_xdist_groups"   # workerinput: the folder the workers write their groups to


def is_loadgroup(config) -> bool:
    return getattr(config.option, "dist", "no") == "loadgroup"


def start(config) -> None:
    """Controller: the folder for the workers' groups."""
    if is_loadgroup(config) and not hasattr(config, "workerinput"):
        config._barge_xdist_groups = tempfile.mkdtemp(prefix="barge-xdist-groups-")


def finish(config) -> None:
    folder = getattr(config, "_barge_xdist_groups", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def configure_node(node) -> None:
    """Controller, for each worker it starts: where to write its groups."""
    folder = getattr(node.config, "_barge_xdist_groups", None)
    if folder:
        node.workerinput[KEY] = folder


def write_groups(config, items) -> None:
    """Worker, once it has collected: {node id: group} for its tests in an xdist_group."""
    folder = getattr(config, "workerinput", {}).get(KEY)
    if not folder:
        return
    groups = {}
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        if names:
            groups[item.nodeid] = "_".join(names)
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(groups))
    os.replace(staging, path)


def make_scheduler(config, log):
    folder = getattr(config, "_barge_xdist_groups", None)
    if not folder:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:   # first asked once every worker has collected (and written)
                written = sorted(Path(folder).glob("*.json"))
                self.groups = json.loads(written[0].read_text()) if written else {}
            group = self.groups.get(nodeid)
            return f"@{group}" if group is not None else nodeid

    return GroupScheduling(config, log)

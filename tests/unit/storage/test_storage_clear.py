"""clear_output: removing a previous result before a job replaces it."""

from __future__ import annotations

import os

from storage import Manifest, commit_output, encode_schema, is_committed, write_part
from storage.clear import clear_output


def test_clear_removes_the_result_and_leaves_other_files(tmp_path, make_table):
    # Given a committed output with an unrelated file beside it
    output = str(tmp_path)
    part = write_part(output, "part-00000-00000.parquet", make_table(3))
    commit_output(output, Manifest(job_id="j", mode="embed", model="m", spec={}, parts=(part,),
                                   schema=encode_schema(make_table(0).schema), stats={}, created_at="now"))
    (tmp_path / "README.txt").write_text("keep me")
    # When it is cleared
    removed = clear_output(output)
    # Then the result is gone and nothing else
    assert removed == 3
    assert not is_committed(output)
    assert os.listdir(tmp_path) == ["README.txt"]
    assert clear_output(output) == 0

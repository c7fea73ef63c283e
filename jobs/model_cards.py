"""Models registered on the workers alone: a submit on another host checks them by card (issue 46).

On many hosts the client (a laptop, a scheduler box, `barge serve`) need not hold a model
that only the GPU nodes have, registered there in BARGE_MODELS. What a submit reads of a
model is small — its JSON configs (mode, width, pooling, prompts, labels) and its
revision, which keys an incremental job's cache — so each worker, as it starts serving a
registered name, writes that much to the shared store:

    worker (has the weights)                        client (has none)
    barge worker --model my-embedder                submit(model="my-embedder")
      resolve_model -> /models/e5 (registered)        not registered here
      announce: name, key, revision, configs  --->    card_model: the configs written to
                                                      BARGE_DATA_DIR/model-cards/<key>-<rev>/,
                                                      checked as a local folder would be

The job records the card's key, the worker's own routing key, so it goes to that worker's
queue; each worker resolves the name itself when it runs a shard. A name registered on
this host wins over a card, as a registered name wins over a folder of the same name;
paths and Hub ids are never carded (each host resolves those itself). The latest
announcement of a name wins: two workers serving one name with different files is the
operator's to avoid (their results would differ too), and `barge status` shows the key.
Migration 0019 creates the table.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Column, Engine, Float, String, Table, Text, select, update

from jobs.cache_keys import model_revision
from jobs.hub_models import SUBMIT_FILES
from jobs.models import ModelRef, registered_models, resolve_model
from jobs.tables import metadata

MAX_FILE_BYTES = 1 << 20      # a config this large is not a config; it is left off the card

model_cards = Table(
    "barge_model_cards", metadata,
    Column("name", String(200), primary_key=True),      # the name a job gives, as registered on the worker
    Column("key", String(200), nullable=False),         # the worker's ModelRef.key: the job's queue
    Column("file_name", String(500)),                   # a one-file model (.gguf, .pt): its name; NULL: a folder
    Column("files", Text, nullable=False),              # JSON {relative path: text} of SUBMIT_FILES present
    Column("revision", String(64), nullable=False),     # jobs.cache_keys.model_revision on the worker
    Column("announced_by", String(200), nullable=False),
    Column("announced_at", Float, nullable=False),
)


@dataclass(frozen=True)
class ModelCard:
    name: str
    key: str
    file_name: str | None
    files: dict[str, str]
    revision: str
    announced_by: str
    announced_at: float


def model_card(name: str, ref: ModelRef, worker_id: str, now: float | None = None) -> ModelCard:
    """What a submit elsewhere needs of a model resolved on this worker."""
    path = Path(ref.path)
    files: dict[str, str] = {}
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            relative = file.relative_to(path).as_posix()
            if any(fnmatch.fnmatchcase(relative, pattern) for pattern in SUBMIT_FILES) \
                    and file.stat().st_size <= MAX_FILE_BYTES:
                files[relative] = file.read_text()
    return ModelCard(name=name, key=ref.key, file_name=None if path.is_dir() else path.name, files=files,
                     revision=model_revision(path), announced_by=worker_id,
                     announced_at=time.time() if now is None else now)


def announce(engine: Engine, names: list[str], worker_id: str, env: dict[str, str] | None = None) -> list[str]:
    """Write the cards of the registered names among `names` (a worker's --model values);
    returns the names carded. Paths and Hub ids are left alone: every host resolves them."""
    registered = registered_models(env)
    announced = []
    for name in names:
        if name not in registered:
            continue
        card = model_card(name, resolve_model(name, env), worker_id)
        values = dict(key=card.key, file_name=card.file_name, files=json.dumps(card.files), revision=card.revision,
                      announced_by=card.announced_by, announced_at=card.announced_at)
        with engine.begin() as conn:   # a plain update, else an insert: portable (as jobs.worker_beats)
            if conn.execute(update(model_cards).where(model_cards.c.name == name).values(**values)).rowcount == 0:
                conn.execute(model_cards.insert().values(name=name, **values))
        announced.append(name)
    return announced


def find_card(engine: Engine, name: str) -> ModelCard | None:
    with engine.connect() as conn:
        row = conn.execute(select(model_cards).where(model_cards.c.name == name)).first()
    return None if row is None else _card(row)


def list_cards(engine: Engine) -> list[ModelCard]:
    with engine.connect() as conn:
        return [_card(row) for row in conn.execute(select(model_cards).order_by(model_cards.c.name))]


def _card(row) -> ModelCard:
    return ModelCard(name=row.name, key=row.key, file_name=row.file_name, files=json.loads(row.files),
                     revision=row.revision, announced_by=row.announced_by, announced_at=row.announced_at)


def card_model(card: ModelCard, cache_dir: Path) -> ModelRef:
    """The card as a model folder on this host (its configs only), written once per revision."""
    folder = cache_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', card.key)}-{card.revision[:16]}"
    if not folder.is_dir():
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".card-"))
        for relative, text in card.files.items():
            target = staging / relative
            if not target.resolve().is_relative_to(staging.resolve()):   # a card is data: no path leaves its folder
                raise ValueError(f"model: the card of {card.name!r} names a file outside its folder: {relative!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        try:
            os.rename(staging, folder)
        except OSError:            # another submit wrote it first: theirs is the same
            shutil.rmtree(staging, ignore_errors=True)
    path = folder / card.file_name if card.file_name else folder
    return ModelRef(key=card.key, path=str(path), revision=card.revision)


def submit_model(name: str, engine: Engine, cache_dir: Path, env: dict[str, str] | None = None) -> ModelRef:
    """The model a submit checks: registered here, else a worker's card, else a folder
    path or a Hub id resolved without weights (jobs.models.resolve_model)."""
    if name not in registered_models(env) and (card := find_card(engine, name)) is not None:
        return card_model(card, cache_dir)
    try:
        return resolve_model(name, env, weights=False)
    except ValueError as exc:
        if "is neither a registered model" not in str(exc):
            raise
        raise ValueError(f"{exc}; no worker has announced a model of that name either (a worker announces "
                         "each registered name it serves when it starts)") from None

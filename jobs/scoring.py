"""Classify and score jobs' params: the engine's param objects they become, the columns a
score job reads, and the checks on them that need neither data nor model.

    classify params    ClassifyParams' fields; all_scores is its return_all_scores
    score params       ScoreParams' fields, and the job's own (SCORE_JOB_PARAMS):
        query_column, document_column    the pair's two text columns (both or neither; neither:
                                         input_column holds [query, document] lists)
        chat                             input_column holds conversations, scored by a reward model
        group_column, top_n              OUTPUT/top_n.parquet: each group's best top_n rows by score

The engine's param types are torch-free (engine.score.params), imported where used so that
jobs.spec, which checks params here, imports no engine module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.score.params import ClassifyParams, ScoreParams

SCORE_JOB_PARAMS = ("query_column", "document_column", "chat", "group_column", "top_n")   # shape the job
# score params that change no row's score (where the texts come from, the top-N file): the
# results cache keys on the rest (jobs.cache_keys), so a job that ranks another top_n reuses rows
ROW_NEUTRAL_PARAMS = ("query_column", "document_column", "group_column", "top_n")
CLASSIFY_RENAMED = {"all_scores": "return_all_scores"}      # job param -> ClassifyParams field
# score params that one kind of scorer reads (engine.score.head_config.score_method); refused for another
METHOD_PARAMS = {"activation": ("cross-encoder",), "instruction": ("yes-no",), "yes_token": ("yes-no",),
                 "no_token": ("yes-no",), "group_by_query": ("yes-no",)}


def classify_params(params: dict) -> ClassifyParams:
    """A classify job's params as ClassifyParams; ValueError naming a bad value."""
    from engine.score.params import ClassifyParams
    return ClassifyParams(**{CLASSIFY_RENAMED.get(name, name): value for name, value in params.items()})


def score_params(params: dict) -> ScoreParams:
    """A score job's params less the job's own, as ScoreParams; ValueError naming a bad value."""
    from engine.score.params import ScoreParams
    return ScoreParams(**{name: value for name, value in params.items() if name not in SCORE_JOB_PARAMS})


def result_params(mode: str, params: dict) -> dict:
    """The params a row's result depends on: a score job's less ROW_NEUTRAL_PARAMS; others' all."""
    if mode != "score":
        return params
    return {name: value for name, value in params.items() if name not in ROW_NEUTRAL_PARAMS}


def pair_columns(params: dict) -> tuple[str, str] | None:
    """A score job's (query column, document column), or None when input_column holds both."""
    if params.get("query_column") is None:
        return None
    return params["query_column"], params["document_column"]


def job_param_field(message: str, mode: str) -> str:
    """The job param a ClassifyParams or ScoreParams message names ("threshold must be ..."),
    as "params.<name>"; "params" when it names none."""
    name = message.split(" ", 1)[0]
    names = {field: param for param, field in CLASSIFY_RENAMED.items()} if mode == "classify" else {}
    return f"params.{names.get(name, name)}" if name.isidentifier() else "params"


def params_problem(mode: str, params: dict) -> tuple[str, str] | None:
    """(field, problem) for score params that do not fit together; None when they do."""
    if mode != "score":
        return None
    if (params.get("query_column") is None) != (params.get("document_column") is None):
        given = "query_column" if params.get("query_column") is not None else "document_column"
        return f"params.{given}", "name both params.query_column and params.document_column, or neither " \
                                  "(then input_column holds [query, document] lists)"
    if params.get("chat") and pair_columns(params) is not None:
        return "params.chat", "a chat job scores the conversations of input_column, not query and document columns"
    for name in ("query_column", "document_column", "group_column"):
        value = params.get(name)
        if value is not None and not value.strip():
            return f"params.{name}", f"must be a column name, got {value!r}"
    top_n, group = params.get("top_n"), params.get("group_column")
    if top_n is not None and top_n < 1:
        return "params.top_n", f"must be a positive integer, got {top_n!r}"
    if (top_n is None) != (group is None):
        return ("params.top_n" if group is None else "params.group_column",
                "params.top_n and params.group_column go together: the best top_n rows of each group")
    return None


def as_pairs(values: list) -> tuple[list, dict[int, str]]:
    """A one-column score job's values ([query, document] lists) as (query, document)
    tuples, and row -> why a value is not a pair (its input becomes None)."""
    pairs, errors = [], {}
    for row, value in enumerate(values):
        if value is None:
            pairs.append(None)
            errors[row] = "pair is null"
        elif len(value) != 2:
            pairs.append(None)
            errors[row] = f"pair has {len(value)} texts, not 2 ([query, document])"
        else:
            pairs.append((value[0], value[1]))
    return pairs, errors

"""Text columns as real files hold them: plain, large, view and dictionary-encoded
strings, and UTF-8 in binary columns, all read as Python strings.

pandas writes a `category` column dictionary-encoded; newer Arrow and Polars write
`string_view`; some writers store text as `binary`. A binary value that is not
UTF-8 is that row's error, never the shard's. A list of {role, content} structs (chat
messages) reads as Python lists of dicts; only generate, classify and score jobs may name
one (jobs.validate). A list of strings (a pair: [query, document], [premise, hypothesis])
reads as Python lists; only classify and score jobs may name one.
"""

from __future__ import annotations

import pyarrow as pa

TEXT_TYPES = ("string, large_string, string_view, binary holding UTF-8, or a dictionary of those "
              "(a generate, classify or score job's column may hold chat messages: a list of {role, content} "
              "structs; a classify or score job's, pairs of texts: a list of strings)")


def is_text_type(column_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(column_type):
        return is_text_type(column_type.value_type)
    return _is_string(column_type) or _is_binary(column_type)


def is_messages_type(column_type: pa.DataType) -> bool:
    """Chat messages as OpenAI's `messages`: a list of structs with string `role` and `content`."""
    if not (pa.types.is_list(column_type) or pa.types.is_large_list(column_type)):
        return False
    item = column_type.value_type
    return (pa.types.is_struct(item) and all(item.get_field_index(name) >= 0 and _is_string(item.field(name).type)
                                             for name in ("role", "content")))


def is_pair_type(column_type: pa.DataType) -> bool:
    """Pairs of texts (a classify or score row: [query, document]): a list of strings."""
    if not (pa.types.is_list(column_type) or pa.types.is_large_list(column_type)
            or pa.types.is_fixed_size_list(column_type)):
        return False
    return _is_string(column_type.value_type)


def text_values(column: pa.Array | pa.ChunkedArray) -> tuple[list[str | None], dict[int, str]]:
    """The column's values as strings (None for nulls), and row -> error for binary values
    that are not UTF-8 (their value becomes None)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not _is_binary(column.type):
        return column.to_pylist(), {}
    values: list[str | None] = []
    errors: dict[int, str] = {}
    for row, raw in enumerate(column.to_pylist()):
        try:
            values.append(None if raw is None else raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            values.append(None)
            errors[row] = f"input is binary that is not UTF-8 text ({error.reason} at byte {error.start})"
    return values, errors


def _is_string(column_type: pa.DataType) -> bool:
    return (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_string_view(column_type))


def _is_binary(column_type: pa.DataType) -> bool:
    return (pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)
            or pa.types.is_binary_view(column_type))

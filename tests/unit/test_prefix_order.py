"""plan_prefix_order (engine/generate/prefix_order.py): rows grouped by shared token prefix,
deepest shared prefixes first, and the trie's node count as the prefill lower bound."""

import random
from array import array

import pytest

from engine.generate.prefix_order import plan_prefix_order


def _is_permutation(order: list[int], num_rows: int) -> bool:
    return sorted(order) == list(range(num_rows))


def _distinct_trie_nodes(prompts: list[list[int]]) -> int:
    """An independent count: every distinct prefix of every prompt is one node."""
    return len({tuple(prompt[:end]) for prompt in prompts for end in range(1, len(prompt) + 1)})


@pytest.mark.parametrize("prompts, expected", [
    ([], []),
    ([[5, 6]], [0]),
    # Two templates interleaved: each template's rows come together.
    ([[1, 1, 1, 7], [2, 2, 2, 8], [1, 1, 1, 9], [2, 2, 2, 3]], [0, 2, 3, 1]),
    # The deeper group (shares 4 tokens) runs before the shallower one (2 tokens),
    # even though the shallower one sorts first.
    ([[3, 3, 5], [3, 3, 4], [8, 8, 8, 8, 1], [8, 8, 8, 8, 2]], [2, 3, 1, 0]),
    # Inside a template: rows sharing a longer continuation run before its lone rows.
    ([[1, 1, 9], [1, 1, 2, 2, 5], [1, 1, 0], [1, 1, 2, 2, 6]], [1, 3, 2, 0]),
    # Equal prompts keep their input order.
    ([[4, 4], [1], [4, 4], [4, 4]], [0, 2, 3, 1]),
])
def test_orders_rows_by_shared_prefix_deepest_first(prompts, expected):
    assert plan_prefix_order(prompts).order == expected


def test_lower_bound_is_the_number_of_distinct_trie_nodes():
    # Given prompts from three templates with random suffixes, duplicates and a prompt
    # that is a prefix of another.
    rng = random.Random(3)
    templates = [[rng.randrange(50) for _ in range(rng.randint(5, 30))] for _ in range(3)]
    prompts = [rng.choice(templates) + [rng.randrange(50) for _ in range(rng.randint(0, 8))] for _ in range(60)]
    prompts += [prompts[0], prompts[5][:3]]
    # When
    plan = plan_prefix_order(prompts)
    # Then
    assert plan.num_prompt_tokens == sum(map(len, prompts))
    assert plan.num_distinct_tokens == _distinct_trie_nodes(prompts)
    assert _is_permutation(plan.order, len(prompts))


def test_every_group_runs_contiguously_and_outputs_can_be_put_back_in_input_order():
    # Given 8 templates, rows shuffled.
    rng = random.Random(7)
    templates = [[100 + t] * 12 + [rng.randrange(1000) for _ in range(20)] for t in range(8)]
    rows = [(t, [t] + templates[t] + [rng.randrange(1000) for _ in range(rng.randint(1, 6))])
            for t in range(8) for _ in range(10)]
    rng.shuffle(rows)
    prompts = [prompt for _, prompt in rows]
    # When
    order = plan_prefix_order(prompts).order
    # Then: a template's rows are one run, and results placed by row index restore input order.
    runs = [rows[row][0] for row in order]
    changes = sum(1 for before, after in zip(runs, runs[1:]) if before != after)
    assert changes == 7
    outputs = [None] * len(prompts)
    for row in order:
        outputs[row] = prompts[row]
    assert outputs == prompts


def test_deepest_group_first_at_every_level():
    # Given a template with two sub-templates of different depth and loose rows.
    base = [9] * 6
    shallow = [base + [1, 1] + [k] for k in range(3)]            # share 8 tokens
    deep = [base + [2] * 10 + [k] for k in range(3)]             # share 16 tokens
    loose = [base + [50 + k] for k in range(2)]                  # share only the base
    prompts = loose + shallow + deep
    # When
    order = plan_prefix_order(prompts).order
    # Then
    assert order == [5, 6, 7, 2, 3, 4, 0, 1]


def test_takes_token_arrays_as_well_as_lists():
    prompts = [array("l", [1, 2, 3]), array("l", [1, 2, 4]), array("l", [0])]
    plan = plan_prefix_order(prompts)
    assert plan.order == [0, 1, 2] and plan.num_distinct_tokens == 5


def test_a_long_chain_of_nested_prefixes_needs_no_recursion():
    prompts = [[1] * length for length in range(1, 3000)]
    plan = plan_prefix_order(prompts)
    assert _is_permutation(plan.order, len(prompts)) and plan.num_distinct_tokens == 2999

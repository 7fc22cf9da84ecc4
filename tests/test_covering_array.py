"""The covering-array generator behind the interaction cases (corpus/builders/covering.py): its rows hold every
pair of option values (and every triple of the groups named), never break a constraint, keep their seed rows,
stay close to the smallest possible count, and come out the same every time."""

from __future__ import annotations

import itertools

import pytest

from corpus.builders import covering


def _pairs(rows, factors):
    return {((a, row[a]), (b, row[b])) for row in rows for a, b in itertools.combinations(factors, 2)}


def test_three_binary_factors_need_only_four_rows():
    factors = {"a": (0, 1), "b": (0, 1), "c": (0, 1)}
    rows = covering.covering_array(factors)
    assert len(rows) == 4  # the fewest rows holding all 12 pairs
    assert len(_pairs(rows, factors)) == 12


def test_every_pair_of_mixed_factors_is_held_in_few_rows():
    factors = {"a": tuple(range(5)), "b": tuple(range(4)), "c": (0, 1, 2), "d": (0, 1), "e": (0, 1)}
    rows = covering.covering_array(factors)
    assert covering.missing(rows, factors) == []
    every = {((a, x), (b, y)) for a, b in itertools.combinations(factors, 2) for x in factors[a] for y in factors[b]}
    assert _pairs(rows, factors) == every
    assert 20 <= len(rows) <= 24  # at least 5 x 4 rows hold the pairs of a and b
    assert len(rows) < len(list(itertools.product(*factors.values()))) // 10


def test_groups_are_covered_at_strength_three():
    factors = {"a": (0, 1, 2), "b": (0, 1), "c": (0, 1), "d": (0, 1, 2)}
    rows = covering.covering_array(factors, groups=[("d", "a", "b")])
    held = {(row["a"], row["b"], row["d"]) for row in rows}
    assert held == set(itertools.product((0, 1, 2), (0, 1), (0, 1, 2)))
    assert covering.missing(rows, factors, groups=[("a", "b", "d")]) == []
    assert covering.missing(covering.covering_array(factors), factors, groups=[("a", "b", "d")])


def test_constraints_are_kept_and_impossible_combinations_are_not_targets():
    factors = {"path": ("dense", "paged"), "padding": ("none", "ragged"), "mask": ("none", "float", "bool")}

    def allowed(row):
        return not (row.get("path") == "paged" and row.get("padding") == "ragged")

    rows = covering.covering_array(factors, allowed=allowed)
    assert all(allowed(row) for row in rows)
    assert covering.missing(rows, factors, allowed=allowed) == []
    assert (("path", "paged"), ("padding", "ragged")) not in covering.targets(factors, allowed=allowed)
    assert {(row["path"], row["mask"]) for row in rows} == set(itertools.product(factors["path"], factors["mask"]))


def test_seed_rows_come_first_and_the_rest_only_completes_them():
    factors = {"a": (0, 1, 2), "b": (0, 1, 2), "c": (0, 1)}
    seed = covering.covering_array(factors, allowed=lambda row: row.get("c") != 1)
    rows = covering.covering_array(factors, seed=seed)
    assert rows[:len(seed)] == seed
    assert covering.missing(rows, factors) == []
    assert len(rows) - len(seed) <= 3  # only the pairs with c = 1 are left: (a, 1) and (b, 1) for each value


def test_the_same_call_gives_the_same_rows():
    factors = {"a": ("x", "y", "z"), "b": (1, 2, 3, 4), "c": (True, False), "d": ("p", "q")}
    first = covering.covering_array(factors, groups=[("a", "b", "c")])
    assert covering.covering_array(factors, groups=[("a", "b", "c")]) == first
    assert [list(row) for row in first] == [list(factors)] * len(first)  # keys in factor order


def test_bad_groups_and_seed_rows_are_refused():
    factors = {"a": (0, 1), "b": (0, 1)}
    with pytest.raises(ValueError, match="unknown factors"):
        covering.covering_array(factors, groups=[("a", "z")])
    with pytest.raises(ValueError, match="seed row"):
        covering.covering_array(factors, seed=[{"a": 0}])
    with pytest.raises(ValueError, match="seed row"):
        covering.covering_array(factors, allowed=lambda row: row.get("a") != 1, seed=[{"a": 1, "b": 0}])

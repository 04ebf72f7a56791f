"""bench/contamination.py's planting rules and scoring, on tiny strings (no environment
is built, no encoder loaded)."""

import random

from bench.contamination import KINDS, filler, planted, renamed, reorder, score_planted, synonyms
from ponder.eval.contamination import Item


def test_the_rules_by_hand():
    assert synonyms("How many apples does Mia have now?") == "What number of apples does Mia own at this point?"
    assert reorder("Mia has 7 apples. How many are left?") == "How many are left? Mia has 7 apples."
    assert reorder("Find the area, given the base.") == "given the base, find the area."
    assert filler("Q?").startswith("Here is one more question") and filler("Q?").endswith("final answer.")
    text = renamed("Mia has 7 apples and 12 pears.", random.Random(0))
    assert text != "Mia has 7 apples and 12 pears." and len(text) == len("Mia has 7 apples and 12 pears.")
    assert " 7 " not in text and " 12 " not in text


def test_planted_items_are_found_and_clean_ones_not():
    train = [Item(f"t{i}", f"Mia has {i + 2} apples and buys {i + 3} more at the market on day {i}. How many "
                           f"apples does Mia have now, and what is the total for item {i}?") for i in range(8)]  # fmt: skip
    plants = planted(train, 2, random.Random(0))
    assert [kind for kind, _, _ in plants] == [kind for kind in KINDS for _ in range(2)]
    clean = [Item("c0", "Translate hello into French."), Item("c1", "Sort the list in reverse order.")]
    result = score_planted("toy", train, clean, 2, None, 0)
    assert result["recall"]["exact"]["any"]["recall"] == 1.0
    assert result["recall"]["renamed"]["numbers8"]["recall"] == 1.0
    assert result["precision_any"] == 1.0 and result["clean_flagged_any"] == 0

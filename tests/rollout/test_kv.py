"""KV-cache pieces of the hf backend: the per-episode store and the preallocated cache."""

import torch

from ponder.rollout.kv import KVStore, SlabCache, past_length


def kv(tokens, layers=2, heads=1, dim=2, value=1.0):
    return [(torch.full((heads, tokens, dim), value), torch.full((heads, tokens, dim), -value)) for _ in range(layers)]


def test_store_serves_a_past_only_to_a_context_that_extends_it():
    store = KVStore()
    for key in "abcd":
        store.put(key, [1, 2, 3], kv(3))
    pasts = store.take_all(["a", "b", "c", "e"], [[1, 2, 3, 4, 5], [1, 2, 9, 4], [1, 2, 3], [1, 2, 3, 4]])
    assert past_length(pasts[0]) == 3  # extends: reused
    assert pasts[1] is None  # diverges
    assert pasts[2] is None  # nothing new to read
    assert pasts[3] is None  # unknown key
    assert len(store) == 0  # d was not requested: its episode ended, so it is dropped


def test_slab_cache_right_aligns_pasts_and_appends_in_place():
    cache = SlabCache(n_layers=1, capacity=5, pasts=[kv(1, layers=1, value=2.0), None, kv(3, layers=1)], past_width=3)
    new = torch.full((3, 1, 1, 2), 7.0)
    keys, values = cache.layers[0].update(new, -new)
    assert keys.shape == (3, 1, 4, 2) and cache.get_seq_length() == 4
    assert keys[0, 0, :, 0].tolist() == [0.0, 0.0, 2.0, 7.0]
    assert keys[1, 0, :, 0].tolist() == [0.0, 0.0, 0.0, 7.0]
    assert values[2, 0, :, 0].tolist() == [-1.0, -1.0, -1.0, -7.0]


def test_slab_cache_grows_past_its_capacity_and_selects_rows():
    cache = SlabCache(n_layers=1, capacity=2, pasts=[None, None], past_width=0)
    chunks = [torch.randn(2, 1, n, 2) for n in (2, 1, 70)]
    for chunk in chunks:
        keys, _ = cache.layers[0].update(chunk, chunk)
    assert torch.equal(keys, torch.cat(chunks, dim=2))
    cache.batch_select_indices(torch.tensor([1]))
    assert torch.equal(cache.layers[0].keys, torch.cat(chunks, dim=2)[1:])
    row = cache.row(0, torch.tensor([0, 72]))
    assert torch.equal(row[0][0], torch.cat(chunks, dim=2)[1, :, [0, 72]])


def test_a_store_with_a_capacity_keeps_other_keys_and_drops_the_oldest():
    store = KVStore(capacity=2)
    for key in "abc":
        store.put(key, [1, 2], kv(2))
    assert len(store) == 2  # "a", stored first, made room for "c"
    (past,) = store.take_all(["b"], [[1, 2, 3]])
    assert past_length(past) == 2 and len(store) == 1  # "c" was not requested and stays
    assert store.take_all(["a"], [[1, 2, 3]]) == [None]


def test_slab_caches_join_right_aligned_at_the_wider_past():
    mine = SlabCache(n_layers=1, capacity=6, pasts=[kv(2, layers=1, value=1.0), kv(3, layers=1, value=2.0)],
                     past_width=3)  # fmt: skip
    mine.layers[0].update(torch.full((2, 1, 1, 2), 5.0), torch.full((2, 1, 1, 2), 5.0))  # 4 slots now
    theirs = SlabCache(n_layers=1, capacity=8, pasts=[kv(5, layers=1, value=3.0)], past_width=5)
    theirs.layers[0].update(torch.full((1, 1, 1, 2), 9.0), torch.full((1, 1, 1, 2), 9.0))  # 6 slots
    mine.join(torch.tensor([1]), theirs)  # keep row 1 of mine, then theirs
    keys = mine.layers[0].keys
    assert keys.shape == (2, 1, 6, 2) and mine.get_seq_length() == 6
    assert keys[0, 0, :, 0].tolist() == [0.0, 0.0, 2.0, 2.0, 2.0, 5.0]  # mine's row 1, padded on the left
    assert keys[1, 0, :, 0].tolist() == [3.0] * 5 + [9.0]
    keys, _ = mine.layers[0].update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))  # room left to append
    assert keys.shape == (2, 1, 7, 2)

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

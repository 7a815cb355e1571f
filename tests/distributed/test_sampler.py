"""DistributedSampler and DistributedBatchIterator, in one process (num_replicas/rank given explicitly).

Oracles: unshuffled, the sampler must hand out exactly the indices of
torch.utils.data.DistributedSampler (pad by wrapping to a multiple of the world size, or drop the
tail; rank r takes indices[r::world]); shuffled, the ranks' shares must come from one common
permutation (together they cover every index, disjointly when nothing is padded), be a pure
function of (seed, epoch), and change with either. The batch iterator must cut exactly the
sampler's indices into batches, and follow the sampler's epoch.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

import pycyxwiz as cx

D = cx.distributed

# (dataset_size, num_replicas): n < R, n == R, n divisible by R, not divisible, n = 1, R = 1, odd R.
SIZES = [(1, 1), (1, 2), (1, 4), (2, 3), (3, 4), (4, 4), (5, 1), (7, 2), (8, 2), (10, 3), (12, 3),
         (13, 4), (17, 5), (100, 8), (101, 8), (1000, 7)]


def sampler(n, R, r, **kw):
    return D.DistributedSampler(n, num_replicas=R, rank=r, **kw)


def torch_indices(n, R, r, drop_last):
    torch = pytest.importorskip("torch")
    ts = torch.utils.data.DistributedSampler(range(n), num_replicas=R, rank=r, shuffle=False, drop_last=drop_last)
    return [int(i) for i in ts], len(ts)


# --- unshuffled: torch's DistributedSampler is the oracle ------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,R", SIZES)
def test_unshuffled_indices_equal_torch(n, R, drop_last):
    pytest.importorskip("torch")
    for r in range(R):
        want, want_len = torch_indices(n, R, r, drop_last)
        s = sampler(n, R, r, shuffle=False, drop_last=drop_last)
        got = list(s.get_indices())
        assert got == want, f"n={n} R={R} rank={r} drop_last={drop_last}: got {got[:20]}, torch {want[:20]}"
        assert all(isinstance(i, int) for i in got)
        assert s.local_size() == want_len == len(s), (n, R, r, drop_last, s.local_size(), len(s), want_len)
        assert s.padded_size() == s.local_size() * R, (n, R, r, drop_last, s.padded_size(), s.local_size())
        assert s.total_size() == n, (n, R, r, drop_last, s.total_size())


@pytest.mark.parametrize("n,R", [(10, 3), (13, 4), (1, 4), (8, 2)])
def test_sizes_do_not_depend_on_shuffle_or_rank(n, R):
    for drop_last in (False, True):
        sizes = {(sampler(n, R, r, shuffle=sh, drop_last=drop_last).local_size(),
                  sampler(n, R, r, shuffle=sh, drop_last=drop_last).padded_size())
                 for r in range(R) for sh in (False, True)}
        assert len(sizes) == 1, f"n={n} R={R} drop_last={drop_last}: sizes differ across ranks/shuffle: {sizes}"
        local, padded = sizes.pop()
        if drop_last:
            assert local == n // R and padded == (n // R) * R, (n, R, local, padded)
        else:
            assert local == math.ceil(n / R) and padded >= n, (n, R, local, padded)


def test_defaults_before_init_are_a_world_of_one():
    assert not D.is_initialized()
    s = D.DistributedSampler(10)  # shuffle=True, seed=0, drop_last=False, world of one
    assert s.local_size() == 10 == len(s) and s.padded_size() == 10 and s.total_size() == 10
    assert sorted(s.get_indices()) == list(range(10))
    assert s.epoch == 0
    u = D.DistributedSampler(10, shuffle=False)
    assert list(u.get_indices()) == list(range(10))
    k = D.DistributedSampler(dataset_size=10, shuffle=True, seed=42, drop_last=False)
    assert list(k.get_indices()) == list(sampler(10, 1, 0, shuffle=True, seed=42).get_indices())


# --- shuffled -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,R", [(100, 4), (101, 4), (10, 3), (3, 4), (64, 1), (1000, 7)])
def test_shuffled_shares_come_from_one_permutation(n, R):
    for epoch in (0, 3):
        shares = []
        for r in range(R):
            s = sampler(n, R, r, shuffle=True, seed=7)
            s.set_epoch(epoch)
            got = list(s.get_indices())
            assert len(got) == s.local_size() == math.ceil(n / R), (n, R, r, len(got), s.local_size())
            assert all(0 <= i < n for i in got), got
            shares.append(got)
        flat = [i for share in shares for i in share]
        counts = Counter(flat)
        assert set(counts) == set(range(n)), f"n={n} R={R}: indices never handed out: {sorted(set(range(n)) - set(counts))[:20]}"
        assert len(flat) == math.ceil(n / R) * R
        if n % R == 0:
            assert all(c == 1 for c in counts.values()), f"n={n} R={R}: an index went to two ranks: " \
                f"{[i for i, c in counts.items() if c > 1][:20]}"
        else:
            # padding repeats a few indices, never more than needed to fill the last row
            assert sum(c - 1 for c in counts.values()) == math.ceil(n / R) * R - n
        if len(shares[0]) >= 8:  # a random share of 8 or more is sorted with probability < 1/40000
            assert shares[0] != sorted(shares[0]), f"shuffle=True handed out indices in order: {shares[0][:20]}"


@pytest.mark.parametrize("n,R", [(100, 4), (101, 3), (12, 3)])
def test_shuffled_with_drop_last(n, R):
    flat = []
    for r in range(R):
        s = sampler(n, R, r, shuffle=True, seed=3, drop_last=True)
        s.set_epoch(2)
        got = list(s.get_indices())
        assert len(got) == s.local_size() == n // R, (n, R, r, len(got), s.local_size())
        flat += got
    assert len(set(flat)) == len(flat) == (n // R) * R, f"n={n} R={R}: an index went to two ranks"
    assert set(flat) <= set(range(n))


def test_shuffle_is_a_pure_function_of_seed_and_epoch():
    n, R = 200, 4
    for r in range(R):
        a = sampler(n, R, r, shuffle=True, seed=11)
        b = sampler(n, R, r, shuffle=True, seed=11)
        for epoch in (0, 1, 5):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert a.epoch == epoch
            assert list(a.get_indices()) == list(b.get_indices()), f"rank {r} epoch {epoch}: two samplers disagree"
        # set_epoch twice with the same epoch gives the same order; going back gives the old order again
        a.set_epoch(1)
        first = list(a.get_indices())
        a.set_epoch(1)
        assert list(a.get_indices()) == first
        a.set_epoch(2)
        a.set_epoch(1)
        assert list(a.get_indices()) == first
        # get_indices() itself does not advance anything
        assert list(a.get_indices()) == first


def test_shuffle_changes_with_epoch_and_seed():
    n, R = 200, 2
    orders = {}
    for seed in (0, 1):
        for epoch in (0, 1, 2):
            s = sampler(n, R, 0, shuffle=True, seed=seed)
            s.set_epoch(epoch)
            orders[seed, epoch] = list(s.get_indices())
    unshuffled = list(sampler(n, R, 0, shuffle=False).get_indices())
    assert orders[0, 0] != orders[0, 1] != orders[0, 2] != orders[0, 0], "set_epoch did not change the order"
    assert orders[0, 0] != orders[1, 0], "a different seed gave the same order"
    assert orders[0, 1] != orders[1, 1], "a different seed gave the same order"
    assert all(o != unshuffled for o in orders.values()), "shuffle=True gave the unshuffled order"
    # a fresh sampler is at epoch 0
    fresh = sampler(n, R, 0, shuffle=True, seed=0)
    assert fresh.epoch == 0 and list(fresh.get_indices()) == orders[0, 0]


def test_unshuffled_ignores_epoch():
    s = sampler(23, 3, 1, shuffle=False)
    before = list(s.get_indices())
    s.set_epoch(4)
    assert list(s.get_indices()) == before


# --- DistributedBatchIterator ---------------------------------------------------------------------

def drain(it):
    batches = []
    while it.has_next():
        batches.append(list(it.next()))
        assert len(batches) < 10_000, "has_next() never became False"
    return batches


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n,R,batch", [(100, 3, 8), (100, 4, 25), (101, 4, 7), (10, 3, 1), (10, 3, 100),
                                       (5, 1, 5), (1, 2, 3), (64, 2, 32)])
def test_batches_cut_the_sampler_indices(n, R, batch, shuffle):
    for r in range(R):
        for drop_last in (False, True):
            s = sampler(n, R, r, shuffle=shuffle, seed=5)
            idx = list(s.get_indices())
            it = D.DistributedBatchIterator(s, batch, drop_last=drop_last)
            want_n = len(idx) // batch if drop_last else math.ceil(len(idx) / batch)
            assert it.num_batches() == want_n == len(it), (n, R, r, batch, drop_last, it.num_batches(), len(it))
            batches = drain(it)
            assert len(batches) == want_n, (n, R, r, batch, drop_last, len(batches))
            assert all(len(b) == batch for b in batches[:-1] if b) and all(0 < len(b) <= batch for b in batches)
            if drop_last:
                assert all(len(b) == batch for b in batches)
                assert [i for b in batches for i in b] == idx[:want_n * batch]
            else:
                assert [i for b in batches for i in b] == idx, f"n={n} R={R} rank={r} batch={batch}"
            assert not it.has_next()
            assert not it.has_next(), "a finished pass restarted by itself"


@pytest.mark.parametrize("drop_last", [False, True])
def test_next_after_the_pass_raises_stop_iteration(drop_last):
    """The API: next() -> StopIteration when the pass is over (as __next__), and nothing restarts by itself."""
    s = sampler(10, 2, 0, shuffle=True)
    it = D.DistributedBatchIterator(s, 3, drop_last=drop_last)
    batches = [list(it.next()) for _ in range(it.num_batches())]
    assert len(batches) == (1 if drop_last else 2)
    assert not it.has_next()
    with pytest.raises(StopIteration):
        it.next()
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        it.next()
    assert not it.has_next(), "a finished pass restarted by itself"
    it.reset()
    assert [list(it.next()) for _ in range(it.num_batches())] == batches


def test_python_iteration_protocol():
    s = sampler(50, 2, 1, shuffle=True, seed=9)
    it = D.DistributedBatchIterator(s, 6)
    assert iter(it) is it
    via_for = [list(b) for b in it]
    it.reset()
    via_next = drain(it)
    assert via_for == via_next and len(via_for) == math.ceil(25 / 6)
    assert [i for b in via_for for i in b] == list(s.get_indices())
    it.reset()
    assert [list(b) for b in it] == via_for  # reset() without an epoch replays the same order


def test_reset_with_epoch_reshuffles_like_set_epoch():
    s = sampler(60, 3, 2, shuffle=True, seed=4)
    it = D.DistributedBatchIterator(s, batch_size=7)
    epoch0 = [i for b in it for i in b]
    assert epoch0 == list(sampler(60, 3, 2, shuffle=True, seed=4).get_indices())
    it.reset(epoch=3)
    ref = sampler(60, 3, 2, shuffle=True, seed=4)
    ref.set_epoch(3)
    epoch3 = [i for b in drain(it) for i in b]
    assert epoch3 == list(ref.get_indices()), "reset(epoch=3) did not give the order of set_epoch(3)"
    assert epoch3 != epoch0
    assert s.epoch == 3, f"reset(epoch=3) left the sampler at epoch {s.epoch}"
    # a reset in the middle of a pass starts over
    it.reset(3)
    it.next()
    it.reset(3)
    assert [i for b in drain(it) for i in b] == epoch3


def test_set_epoch_on_the_sampler_starts_a_new_pass():
    s = sampler(40, 2, 0, shuffle=True, seed=1)
    it = D.DistributedBatchIterator(s, 6)
    order = {}
    for e in range(3):
        ref = sampler(40, 2, 0, shuffle=True, seed=1)
        ref.set_epoch(e)
        order[e] = list(ref.get_indices())
    # the guide's loop: set_epoch at the start of each epoch, then while has_next()
    for e in range(3):
        s.set_epoch(e)
        got = [i for b in drain(it) for i in b]
        assert got == order[e], f"epoch {e}: the iterator did not follow sampler.set_epoch({e})"
    # set_epoch in the middle of a pass: the next has_next() starts the new epoch from its beginning
    s.set_epoch(0)
    assert it.has_next()
    first = list(it.next())
    assert first == order[0][:6]
    s.set_epoch(1)
    assert it.has_next()
    assert [i for b in drain(it) for i in b] == order[1]


# --- bad arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,name", [
    (dict(dataset_size=0), "dataset_size"),
    (dict(dataset_size=-1), "dataset_size"),
    (dict(dataset_size=-100, num_replicas=2, rank=0), "dataset_size"),
    (dict(dataset_size=10, num_replicas=2, rank=2), "rank"),
    (dict(dataset_size=10, num_replicas=2, rank=5), "rank"),
    (dict(dataset_size=10, num_replicas=0, rank=0), "num_replicas"),
])
def test_sampler_bad_arguments(kwargs, name):
    with pytest.raises(ValueError) as info:
        D.DistributedSampler(**kwargs)
    assert name in str(info.value), f"{kwargs}: the message does not name {name}: {info.value}"


def test_sampler_negative_rank():
    # A bad value (not a bad type): ValueError naming the argument, its value and the valid range.
    with pytest.raises(ValueError) as info:
        D.DistributedSampler(10, num_replicas=2, rank=-1)
    assert "rank=-1" in str(info.value) and "num_replicas=2" in str(info.value), info.value


def test_batch_iterator_bad_batch_size():
    s = sampler(10, 2, 0)
    with pytest.raises(ValueError) as info:
        D.DistributedBatchIterator(s, 0)
    assert "batch_size" in str(info.value), info.value
    with pytest.raises(ValueError) as info:
        D.DistributedBatchIterator(s, -1)
    assert "batch_size=-1" in str(info.value), info.value

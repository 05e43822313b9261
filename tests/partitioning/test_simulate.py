"""The schedule simulator on the engine's own action orders: textbook bubbles, dependencies, activation peaks.

Uniform chunks: every chunk costs f forward, i input-gradient, w weight-gradient (b = i + w the whole backward),
no send time.  What is asserted, and why it is the textbook:

* GPipe and 1F1B (one stage per rank, K ranks, m micro-batches): bubble fraction (K-1)/(m+K-1) (GPipe paper,
  Megatron-LM): every rank idles (K-1)(f+b) while the pipeline fills and drains.
* Interleaved 1F1B and looped BFS, V chunks per rank of a model cut in K x V: (K-1)/(V m+K-1) (Narayanan et al.
  2021, section 2.2.2): the fill/drain is (K-1) chunk times, a V-th of a stage's.
* Zero bubble (Qi et al. 2024): ZB-H1's bubble is (K-1)(F+B-W) in its notation (B the input gradient, W the
  weight gradient), 1F1B's (K-1)(F+B+W).  The engine's interleaved zero-bubble order gives exactly (K-1)(f+i-w)
  at chunk level for any f, i, w we try; with f = i = w that is a third of 1F1B's bubble on the same chunks.
* ZB-V and DualPipeV: both docstrings promise their best when f = i = w.  There the engine's orders leave each
  rank (K-1) f idle (the first forward crossing the ranks; not the papers' idealised zero), the same as ZB-H1;
  ZB-V holds at most 2K chunk activations per rank (1F1B's K stage activations, the ZB-V paper's claim), and
  DualPipeV one more, 2K + 1.
"""

from __future__ import annotations

import pytest

from common.errors import UserError
from partitioning import schedules
from partitioning.schedules import Action, orders, placement
from partitioning.solve.simulate import ChunkCost, duration, simulate


def run(name: str, ranks: int, virtual: int, micro: int, f: float = 1.0, i: float = 1.0, w: float = 1.0,
        send: float = 0.0, activation: float = 1.0):
    chunks = [ChunkCost(f, i + w, w, send, activation) for _ in range(ranks * virtual)]
    return simulate(orders(name, ranks, virtual, micro), placement(name, ranks, virtual), chunks)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("ranks", "micro", "f", "b"), [(4, 8, 1.0, 2.0), (4, 4, 1.0, 1.0), (8, 16, 2.0, 3.0),
                                                       (3, 12, 0.5, 1.5)])
def test_one_stage_per_rank_bubble(name: str, ranks: int, micro: int, f: float, b: float) -> None:
    timeline = run(name, ranks, 1, micro, f, b / 2, b / 2)
    assert timeline.step_time == pytest.approx((micro + ranks - 1) * (f + b))
    assert timeline.bubble == pytest.approx((ranks - 1) / (micro + ranks - 1))


@pytest.mark.parametrize("name", ["interleaved1f1b", "loopedbfs"])
@pytest.mark.parametrize(("ranks", "virtual", "micro"), [(4, 2, 8), (4, 4, 8), (8, 2, 16), (4, 3, 12)])
def test_interleaved_bubble(name: str, ranks: int, virtual: int, micro: int) -> None:
    assert run(name, ranks, virtual, micro).bubble == pytest.approx((ranks - 1) / (virtual * micro + ranks - 1))


@pytest.mark.parametrize(("f", "i", "w"), [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0)])
@pytest.mark.parametrize(("ranks", "micro"), [(4, 8), (6, 12)])
def test_zero_bubble_h1(f: float, i: float, w: float, ranks: int, micro: int) -> None:
    virtual = 2
    busy = micro * virtual * (f + i + w)
    timeline = run("interleavedzerobubble", ranks, virtual, micro, f, i, w)
    assert timeline.busy == pytest.approx([busy] * ranks)
    assert timeline.step_time - busy == pytest.approx((ranks - 1) * (f + i - w))
    if f == i == w:
        one_f_one_b = run("interleaved1f1b", ranks, virtual, micro, f, i, w).step_time - busy
        assert timeline.step_time - busy == pytest.approx(one_f_one_b / 3)


@pytest.mark.parametrize(("ranks", "micro"), [(4, 8), (4, 12), (8, 16)])
def test_v_shaped_at_equal_parts(ranks: int, micro: int) -> None:
    busy = micro * 2 * 3.0
    zbv, dual = run("zbvzerobubble", ranks, 2, micro), run("dualpipev", ranks, 2, micro)
    assert zbv.step_time - busy == pytest.approx(ranks - 1) and dual.step_time - busy == pytest.approx(ranks - 1)
    assert zbv.peak_activations == (2 * ranks,) * ranks
    assert dual.peak_activations == (2 * ranks + 1,) * ranks


@pytest.mark.parametrize(("ranks", "micro"), [(4, 8), (4, 2), (3, 3)])
def test_activation_peaks_gpipe_m_1f1b_ranks(ranks: int, micro: int) -> None:
    assert run("gpipe", ranks, 1, micro, activation=5.0).peak_activations == (5.0 * micro,) * ranks
    assert run("1f1b", ranks, 1, micro, activation=5.0).peak_activations == tuple(
        5.0 * min(micro, ranks - r) for r in range(ranks))


def test_gpipe_closed_form_is_the_engines_order() -> None:
    built = schedules._built("gpipe", 4, 1, 6)
    engine = {r: [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in actions
                  if a is not None and a.computation_type.value in "FB"] for r, actions in built.pipeline_order.items()}
    assert engine == {r: [tuple(a) for a in order] for r, order in enumerate(orders("gpipe", 4, 1, 6))}


@pytest.mark.parametrize("name", schedules.SCHEDULES)
def test_every_order_runs_each_part_once_and_respects_dependencies(name: str) -> None:
    ranks, micro = 3, 6
    virtual = schedules.default_virtual_stages(name)
    where = placement(name, ranks, virtual)
    # uneven chunks and sends, so that a dependency the simulation missed would show as an early start
    chunks = [ChunkCost(1.0 + c, 2.0 + c / 2, 0.7, 0.3 * (c + 1), 1.0) for c in range(ranks * virtual)]
    timeline = simulate(orders(name, ranks, virtual, micro), where, chunks)
    done = list(timeline.ends)
    assert len(done) == len(set(done))
    for c in range(ranks * virtual):
        for m in range(micro):
            assert Action(c, "F", m) in timeline.ends
            assert (Action(c, "B", m) in timeline.ends) != (Action(c, "I", m) in timeline.ends)
            assert (Action(c, "I", m) in timeline.ends) == (Action(c, "W", m) in timeline.ends)

    def start(action: Action) -> float:
        return timeline.ends[action] - duration(action, chunks[action.chunk])

    def grad(c: int, m: int) -> float:
        return timeline.ends.get(Action(c, "B", m), timeline.ends.get(Action(c, "I", m), 0.0))

    last = ranks * virtual - 1
    for action in timeline.ends:
        c, m = action.chunk, action.micro_batch
        if action.kind == "F" and c:
            hop = chunks[c - 1].send if where[c - 1] != where[c] else 0.0
            assert start(action) >= timeline.ends[Action(c - 1, "F", m)] + hop - 1e-9
        elif action.kind in "BI":
            assert start(action) >= timeline.ends[Action(c, "F", m)] - 1e-9
            if c < last:
                hop = chunks[c].send if where[c] != where[c + 1] else 0.0
                assert start(action) >= grad(c + 1, m) + hop - 1e-9
        elif action.kind == "W":
            assert start(action) >= timeline.ends[Action(c, "I", m)] - 1e-9
    for order in orders(name, ranks, virtual, micro):  # a rank runs one action at a time, in its order
        for before, after in zip(order, order[1:]):
            assert start(after) >= timeline.ends[before] - 1e-9


def test_an_order_against_its_dependencies_is_a_one_line_error() -> None:
    backwards = ((Action(0, "B", 0), Action(0, "F", 0)),)
    with pytest.raises(UserError, match="deadlocks"):
        simulate(backwards, (0,), [ChunkCost(1.0, 2.0)])

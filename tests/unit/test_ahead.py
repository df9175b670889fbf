"""Views one step ahead (t3ar.method.ahead): the helper's contract, and whole runs identical with it on or off."""

import os
import threading
from typing import Any

import pytest
import torch
from tiny_models import TinyBackbone, tiny_config, tiny_problem

from t3ar.device import seed_everything
from t3ar.method import registry
from t3ar.method.adapt import adapt
from t3ar.method.ahead import NICE, Ahead, enabled
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.method.supervised import TrainConfig, train_supervised
from t3ar.models.classifier import Classifier


def test_items_come_in_order_each_prepared_once_one_at_a_time_on_a_background_thread() -> None:
    calls: list[tuple[int, str]] = []
    running = [0]
    lock = threading.Lock()
    nice: list[int] = []

    def prepare(i: int) -> int:
        with lock:
            running[0] += 1
            assert running[0] == 1  # never two at once: the random streams are drawn in batch order
        calls.append((i, threading.current_thread().name))
        nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        with lock:
            running[0] -= 1
        return i * 10

    with Ahead(range(5), prepare, on=True) as ahead:
        got = [(item, prepared) for item, prepared, seconds in ahead if seconds >= 0]
    assert got == [(i, i * 10) for i in range(5)]
    assert [i for i, _ in calls] == list(range(5))
    assert all(name.startswith("t3ar-views") for _, name in calls)
    assert nice == [NICE] * 5  # the lowest priority: only the cycles the step leaves idle (Linux)
    with Ahead(range(3), prepare, on=False) as ahead:
        assert [p for _, p, _ in ahead] == [0, 10, 20]
    assert all(name == threading.current_thread().name for _, name in calls[5:])


def test_the_next_item_is_prepared_while_the_caller_works_on_this_one() -> None:
    second_started = threading.Event()

    def prepare(i: int) -> int:
        if i == 1:
            second_started.set()
        return i

    for on in (True, False):
        second_started.clear()
        with Ahead(range(3), prepare, on=on) as ahead:
            for item, _, _ in ahead:
                if item == 0:  # still working on item 0: item 1's views are (or are not) being made meanwhile
                    assert second_started.wait(timeout=10 if on else 0.2) is on
                ahead.settle()
                assert ahead.waited >= 0


def test_settle_waits_for_the_preparation_ahead_and_errors_surface_with_their_item() -> None:
    release = threading.Event()
    done: list[int] = []

    def prepare(i: int) -> int:
        if i == 1:
            release.wait(timeout=10)
        if i == 2:
            raise ValueError("bad batch 2")
        done.append(i)
        return i

    seen = []
    with pytest.raises(ValueError, match="bad batch 2"), Ahead(range(4), prepare, on=True) as ahead:
        for item, _, _ in ahead:
            if item == 0:
                assert done == [0]
                release.set()
                ahead.settle()
                assert done == [0, 1]  # settle returned only once item 1's preparation was finished
            seen.append(item)
            ahead.settle()  # item 2's failure does not raise here: it belongs to item 2
    assert seen == [0, 1]


def test_leaving_early_stops_the_thread() -> None:
    before = {t.name for t in threading.enumerate()}
    with Ahead(range(100), lambda i: i, on=True) as ahead:
        for item, _, _ in ahead:
            if item == 3:
                break
    assert not any(t.name.startswith("t3ar-views") for t in threading.enumerate() if t.name not in before)


def test_auto_is_on_for_cpu_and_cuda() -> None:
    assert enabled(None, torch.device("cpu")) and enabled(None, torch.device("cuda"))
    assert not enabled(None, torch.device("mps"))  # not measured there
    assert not enabled(False, torch.device("cpu")) and enabled(True, torch.device("cuda"))


def _adapt(method: str, ahead: bool, **kw: object) -> tuple[dict[str, torch.Tensor], list[float]]:
    model, target, pool, cand = tiny_problem(14, 9, 4, seed=123)
    switches: dict[str, Any] = {k: kw.pop(k) for k in PROBE_SWITCHES if k in kw}  # the benchmarks' (Probe)
    cfg = tiny_config(method, k=2, epochs=3, batch_size=4, bank_size=32, train_groups=None, seed=5,
                      views_ahead=ahead, **kw)
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=cand[:, :2], pool_images=pool,
                candidates=cand, labels=torch.arange(14) % 3, device=torch.device("cpu"),
                generator=torch.Generator().manual_seed(7), probe=Probe(**switches))
    return model.state_dict(), [h.loss for h in res.history]


@pytest.mark.parametrize("method,kw", [(m, {}) for m in registry.names() if registry.get(m).optimises]
                         + [("t3ar", {"redraw_neighbours": True}), ("t3ar", {"mode": "train"})])
def test_a_run_is_identical_with_views_ahead_on_and_off(method: str, kw: dict[str, object]) -> None:
    (s_off, l_off), (s_on, l_on) = _adapt(method, False, **kw), _adapt(method, True, **kw)
    assert len(l_on) == 12 and l_on == l_off  # 14 images / batch 4 -> 4 steps (the last of 2) x 3 epochs
    assert all(torch.equal(s_on[k], s_off[k]) for k in s_off)


def test_supervised_is_identical_with_views_ahead_on_and_off() -> None:
    out = []
    for ahead in (False, True):
        seed_everything(0)
        model = Classifier(TinyBackbone(), 8, 3, 16)
        images = torch.randint(0, 256, (10, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        res = train_supervised(model, images, torch.arange(10) % 3, TrainConfig(epochs=2, batch_size=4,
                               views_ahead=ahead), mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"))
        out.append((model.state_dict(), [h.loss for h in res.history]))
    (s_off, l_off), (s_on, l_on) = out
    assert len(l_on) == 6 and l_on == l_off
    assert all(torch.equal(s_on[k], s_off[k]) for k in s_off)

"""The benchmarks' markdown tables: one helper writes them all, to the letter of the hand-built tables it replaced
(the expected lines below are what the reports wrote before)."""

from __future__ import annotations

import math

from t3ar_bench.markdown import row, table
from t3ar_bench.method.acceptance_report import label_free_section, winner_rule_lines
from t3ar_bench.method.labelled import LABELS_ARM, RANDOM_ARM
from t3ar_bench.method.labelled_report import option_table, use_section


def test_a_table_is_its_header_its_rule_and_a_line_per_row() -> None:
    assert table(["a", "b c"], [[1, ""], (2.5, "–")]) == ["| a | b c |", "|---|---|", "| 1 |  |", "| 2.5 | – |"]
    assert table(["only"], []) == ["| only |", "|---|"]
    assert row(x for x in "ab") == "| a | b |"


def test_the_reports_tables_read_as_before() -> None:
    wr = {"shifts": ["a", "b"], "per_class": 2, "chosen": "argmax", "default": "simplest",
          "table": [{"rule": "argmax", "per_class": 1, "cells": 4, "worst": 0.41, "per_shift": {"a": 0.41, "b": 0.5},
                     "wins": {"t3ar": 3, "bn-adapt": 1}},
                    {"rule": "simplest", "per_class": 2, "cells": 0, "worst": math.nan, "per_shift": {}, "wins": {}}]}
    assert winner_rule_lines({"selection": {"winner_rule": wr}})[2:] == [
        "| rule | images per class | cells | worst shift | per shift | wins |", "|---|---|---|---|---|---|",
        "| argmax | 1 | 4 | 41.0 | a 41.0, b 50.0 | bn-adapt 1, t3ar 3 |", "| simplest | 2 | 0 | – |  |  |", ""]
    free = {"label_free_selection": {"entropy": {"cells": 3, "right": 1, "share": math.nan, "share_at_zero": 0.5},
                                     "mystery": {"cells": 0, "right": 0, "share": 0.25, "share_at_zero": math.nan}},
            "label_free_verdict": {"best": None}}
    assert label_free_section(free)[2:] == [
        "| criterion | cells | right | share | share at threshold 0 |", "|---|---|---|---|---|",
        "| entropy (minus the mean prediction entropy) | 3 | 1 | – | 50 % |", "| mystery | 0 | 0 | 25 % | – |", "",
        "No cell: bn-adapt and the default never differ by more than a point."]
    use = {"label_use": {"test": {"0.3": {
        LABELS_ARM: {"per_step": 4.0, "distinct": 30, "query_class_share": 0.6,
                     "style_share": {"blob": 0.3, "noto": 0.7}},
        RANDOM_ARM: {"per_step": 3.25, "distinct": 12.6, "query_class_share": 0.1234, "style_share": {}}}}}}
    assert use_section(use)[2:] == [
        "| mode | fraction | arm | per step | distinct | query's class | styles |", "|---|---|---|---|---|---|---|",
        "| test | 30 % | **T3AR with the labelled pool** (retrieved labelled neighbours as data) | 4.0 | 30 | 60.0 % | "
        "noto 70 %, blob 30 % |",
        "| test | 30 % | random-labelled control (as many labelled pool items per step, drawn at random) | 3.2 | 13 | "
        "12.3 % |  |"]
    assert option_table([{"option": "lr", "top1": 0.4321, "base_top1": 0.5, "kept": False}]) == [
        "| option | top-1 with it | best before | kept |", "|---|---|---|---|", "| lr | 43.2 | 50.0 | no |"]

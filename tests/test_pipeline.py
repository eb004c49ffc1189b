"""The pass pipeline: one record per pass, its order checked against what each pass needs."""
from __future__ import annotations

import dataclasses

import pytest

from dynamo_relational import passes
from dynamo_relational.options import Options


def test_every_pass_runs_after_the_passes_it_needs():
    passes.check_order(passes.PIPELINE)
    names = [p.name for p in passes.PIPELINE]
    with pytest.raises(ValueError, match="vectorize runs before \\['grouping'\\]"):
        passes.check_order(tuple(sorted(passes.PIPELINE, key=lambda p: p.name != "vectorize")))
    with pytest.raises(ValueError, match="appears twice"):
        passes.check_order(passes.PIPELINE + passes.PIPELINE[-1:])
    assert len(set(names)) == len(names)


def test_the_optional_passes_are_the_records_marked_optional_and_only_they_may_be_disabled():
    assert passes.OPTIONAL_PASSES == tuple(p.name for p in passes.PIPELINE if p.optional)
    assert "grouping" not in passes.OPTIONAL_PASSES and "fold_bias" in passes.OPTIONAL_PASSES
    Options.from_mapping({"disable": passes.OPTIONAL_PASSES})
    with pytest.raises(Exception, match="grouping"):
        Options.from_mapping({"disable": ("grouping",)})


def test_every_record_says_what_its_pass_does():
    for p in passes.PIPELINE:
        assert p.does and callable(p.run) and dataclasses.is_dataclass(p), p.name

"""The NeuraLogic bridge: modules built from the Java engine's networks reproduce the engine.

Needs Java and the optional ``neuralogic`` package (``pip install -e .[neuralogic]``); skipped
otherwise. The default run uses the small bundled datasets and a few Mutagenesis molecules;
``-m slow`` compiles every bundled dataset and template in full, with and without the engine's
compression.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.helpers import assert_compiled_matches_eager

if shutil.which("java") is None:
    pytest.skip("the NeuraLogic bridge needs Java (no `java` on PATH)", allow_module_level=True)
pytest.importorskip("neuralogic",
                    reason="the optional `neuralogic` package is not installed (pip install -e .[neuralogic])")

from dynamo_relational.neuralogic import TRANSFORMATIONS, UnsupportedNeuronError, to_module  # noqa: E402

EXACT = dict(rtol=0, atol=1e-8)
MUTAGENESIS_TEMPLATES = ["template", "template_gnn", "template_graphlets", "template_crosssum",
                         "template_elementProduct", "template_product", "template_partial"]
SMALL = ["XOR", "XOR_Vectorized", "Trains", "Family"]


@functools.cache
def _quiet() -> None:
    import neuralogic.logging

    neuralogic.logging.clear_handlers()   # the engine logs every grounded sample to stdout otherwise


def _model_and_dataset(name: str):
    import neuralogic.utils.data as data
    from neuralogic.core.model import Model
    from neuralogic.dataset import FileDataset

    if not name.startswith("template"):
        return getattr(data, name)()
    base = os.path.join(data.base_path, "molecules", "mutagenesis")
    model = Model(model_file=os.path.join(base, "templates", name + ".txt"))
    dataset = FileDataset(examples_file=os.path.join(base, "examples.txt"),
                          queries_file=os.path.join(base, "queries.txt"))
    return model, dataset


@functools.cache
def built(name: str, compression: bool):
    """(model, built dataset) of a bundled dataset; Mutagenesis templates are named by file."""
    from neuralogic.core import Settings

    _quiet()
    model, dataset = _model_and_dataset(name)
    try:
        model.build(Settings(iso_value_compression=compression, chain_pruning=compression))
        return model, model.build_dataset(dataset)
    except Exception as error:   # a Java exception: the engine itself cannot run this template
        pytest.skip(f"the NeuraLogic engine cannot build {name}: {str(error).splitlines()[0][:160]}")


def engine_outputs(model, samples) -> torch.Tensor:
    return torch.tensor(model(samples), dtype=torch.float64).reshape(-1)


def compiled_outputs(module, **options) -> torch.Tensor:
    torch._dynamo.reset()
    return torch.compile(module, backend="relational", options={"strict": True, **options})()


# ---------------------------------------------------------------------------------------------
# Default run
# ---------------------------------------------------------------------------------------------

def test_import_does_not_need_java():
    code = "import sys, dynamo_relational; assert 'jpype' not in sys.modules and 'neuralogic' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize("name", sorted(TRANSFORMATIONS))
def test_transformation_matches_engine_function(name):
    """Each elementwise transformation against the engine's own Java function, on both sides of its kinks."""
    import jpype

    _quiet()
    built("XOR", False)   # starts the JVM
    package = "cz.cvut.fel.ida.algebra.functions.transformation."
    java_class = (package + "joint.Identity") if name == "Identity" else (package + "elementwise." + name)
    function = jpype.JClass(java_class)()
    points = [-120.0, -3.0, -0.5, 0.0, 0.25, 0.7, 2.5, 120.0]
    if name in ("Logarithm", "SquareRoot", "Inverse"):
        points = [0.1, 0.5, 1.0, 2.5, 7.0]
    scalar = jpype.JClass("cz.cvut.fel.ida.algebra.values.ScalarValue")
    want = torch.tensor([float(function.evaluate(scalar(x)).get(0)) for x in points], dtype=torch.float64)
    module = to_module(*built("XOR", False))
    x = torch.tensor(points, dtype=torch.float64)
    got = TRANSFORMATIONS[name](x, module.leaky_relu_alpha)
    torch.testing.assert_close(got, want, **EXACT)


@pytest.mark.parametrize("compression", [False, True], ids=["uncompressed", "compressed"])
@pytest.mark.parametrize("name", SMALL)
def test_eager_module_matches_engine(name, compression):
    model, dataset = built(name, compression)
    module = to_module(model, dataset)
    assert all(not p.requires_grad or p.dtype == torch.float64 for p in module.parameters())
    torch.testing.assert_close(module(), engine_outputs(model, dataset), **EXACT)


@pytest.mark.parametrize("compression", [False, True], ids=["uncompressed", "compressed"])
@pytest.mark.parametrize("name", ["XOR", "Family", "XOR_Vectorized"])
def test_compiled_module_matches_engine(name, compression):
    model, dataset = built(name, compression)
    module = to_module(model, dataset)
    torch.testing.assert_close(compiled_outputs(module, inductor=False), engine_outputs(model, dataset), **EXACT)


def test_compiled_mutagenesis_molecules_match_engine_forward_and_gradients():
    """Two molecules of the default template (vector weights and values, 3x3 matrices, avg, offsets)."""
    model, dataset = built("template", True)
    samples = list(dataset)[:2]
    module = to_module(model, samples)
    report = assert_compiled_matches_eager(module, inductor=False)   # outputs and gradients vs eager
    assert report.nodes_after < report.nodes_before / 5
    torch.testing.assert_close(report.compiled(), engine_outputs(model, samples), **EXACT)


def test_inductor_compiled_module_matches_engine():
    model, dataset = built("XOR_Vectorized", True)
    module = to_module(model, dataset)
    torch.testing.assert_close(compiled_outputs(module), engine_outputs(model, dataset), **EXACT)


def _synthetic(aggregation: str, transformation: str, combination: str, dims: tuple[int, ...]):
    """A two-layer template using the given functions, on two tiny examples."""
    from neuralogic.core import Aggregation, Combination, R, Settings, Transformation, V
    from neuralogic.core.model import Model
    from neuralogic.dataset import Dataset

    _quiet()
    model = Model()
    functions = [getattr(Transformation, transformation), getattr(Aggregation, aggregation),
                 getattr(Combination, combination)]
    model += (R.h(V.X) <= (R.a(V.X, V.Y)[dims], R.b(V.Y)[dims])) | functions
    model += R.h(V.X)[dims]    # a learnable template fact
    head = (1,) + dims[:1] if len(dims) > 1 else dims
    model += (R.out <= R.h(V.X)[head]) | [Transformation.TANH, Aggregation.AVG]
    model.build(Settings(iso_value_compression=False, chain_pruning=False))
    dataset = Dataset()
    dataset.add(R.out[1.0], [R.a(1, 2)[0.5], R.a(1, 3)[-0.4], R.b(2)[0.3], R.b(3)[1.5], R.a(2, 3)[0.2]])
    dataset.add(R.out[0.0], [R.a(1, 2)[0.1], R.a(2, 3)[-0.7], R.b(2)[0.9], R.b(3)[-1.2], R.a(2, 2)[2.0]])
    return model, model.build_dataset(dataset)


@pytest.mark.parametrize("dims", [(1,), (3, 1)], ids=["scalar", "vector"])
@pytest.mark.parametrize("combination", ["SUM", "MAX", "ELPRODUCT", "PRODUCT"])
@pytest.mark.parametrize("aggregation", ["SUM", "AVG", "MAX", "MIN"])
def test_functions_match_engine(aggregation, combination, dims):
    """Aggregations x combinations, scalar and vector weights: eager against the engine."""
    if combination == "PRODUCT" and dims != (1,):
        pytest.skip("the engine itself rejects a product of two column vectors")
    model, dataset = _synthetic(aggregation, "SIGMOID", combination, dims)
    module = to_module(model, dataset)
    torch.testing.assert_close(module(), engine_outputs(model, dataset), **EXACT)


def test_fast_frontend_matches_engine():
    """dynamo_relational.compile (torch.fx tracing instead of Dynamo) on a bridged module."""
    import dynamo_relational

    model, dataset = built("Trains", True)
    module = to_module(model, dataset)
    compiled = dynamo_relational.compile(module, (), strict=True, inductor=False)
    torch.testing.assert_close(compiled(), engine_outputs(model, dataset), **EXACT)


def test_compiled_max_and_vectors_match_engine():
    model, dataset = _synthetic("MAX", "RELU", "MAX", (3, 1))
    module = to_module(model, dataset)
    torch.testing.assert_close(compiled_outputs(module, inductor=False), engine_outputs(model, dataset), **EXACT)


def test_unsupported_function_is_a_clear_error():
    from neuralogic.core import R, Settings, Transformation, V
    from neuralogic.core.model import Model
    from neuralogic.dataset import Dataset

    _quiet()
    model = Model()
    model += (R.h(V.X) <= (R.a(V.X)[2, 1], R.b(V.X)[2, 1])) | [Transformation.SOFTMAX]
    model += R.out <= R.h(V.X)[1, 2]
    model.build(Settings(iso_value_compression=False, chain_pruning=False))
    dataset = Dataset()
    dataset.add(R.out[1.0], [R.a(1)[0.5], R.b(1)[0.3]])
    with pytest.raises(UnsupportedNeuronError, match="transformation Softmax is not supported"):
        to_module(model, model.build_dataset(dataset))


def test_adam_training_on_the_compiled_module_converges():
    model, dataset = built("XOR", True)
    module = to_module(model, dataset)
    # A fixed start: the engine's random initial weights depend on what ran before in this
    # process, and some of them sit on XOR's plateau (every output 0.5, loss 0.25).
    torch.manual_seed(2)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-2.0, 2.0)
    compiled = torch.compile(module, backend="relational", options={"strict": True})
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    losses = []
    for _ in range(150):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(), module.targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.01 < losses[0], losses[::15]
    torch.testing.assert_close(compiled(), module(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["XOR", "Trains"])
def test_value_compression_of_uncompressed_networks_matches_engine(name):
    """The engine's compression off, ours on: the facts buffer's equal values merge rows layer by
    layer (Trains: 441 first-layer rows into 25), outputs and gradients as before."""
    import dynamo_relational

    model, dataset = built(name, False)
    module = to_module(model, dataset)
    compiled = dynamo_relational.compile(module, (), strict=True, value_compression=True)
    assert compiled.report.graphs[0].stats["rows_compressed"]
    torch.testing.assert_close(compiled(), engine_outputs(model, dataset), **EXACT)
    got = torch.autograd.grad(compiled().sum(), list(module.parameters()))
    want = torch.autograd.grad(module().sum(), list(module.parameters()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **EXACT)


# ---------------------------------------------------------------------------------------------
# Slow: every bundled dataset in full, compiled with the default options (Inductor)
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("compression", [False, True], ids=["uncompressed", "compressed"])
@pytest.mark.parametrize("name", SMALL)
def test_small_bundled_datasets_compiled_match_engine(name, compression):
    """torch.compile(module, backend="relational") on the whole data set."""
    model, dataset = built(name, compression)
    module = to_module(model, dataset)
    torch.testing.assert_close(compiled_outputs(module), engine_outputs(model, dataset), **EXACT)


@pytest.mark.slow
@pytest.mark.parametrize("compression", [False, True], ids=["uncompressed", "compressed"])
@pytest.mark.parametrize("name", ["Nations"] + MUTAGENESIS_TEMPLATES)
def test_large_bundled_datasets_compiled_match_engine(name, compression):
    """The same passes through the fast front-end: 10^4-10^5 neurons would take Dynamo tens of minutes."""
    import dynamo_relational

    model, dataset = built(name, compression)
    module = to_module(model, dataset)
    compiled = dynamo_relational.compile(module, (), strict=True)
    torch.testing.assert_close(compiled(), engine_outputs(model, dataset), **EXACT)


def test_samples_trained_in_mini_batches_match_the_whole_module():
    """Each sample's network alone (forward(i)), batched by dynamo_relational.batch in shuffled mini-batches:
    the outputs and gradients of the module computing every sample at once."""
    import dynamo_relational

    model, dataset = built("template", False)
    module = to_module(model, list(dataset)[:8])
    batched = dynamo_relational.batch(module)
    for batch in ([3, 0, 5], [1, 2, 4, 6, 7], [5, 3, 3], [7, 1, 0, 2]):   # the first two trace, run eagerly
        got = torch.cat(batched([(i,) for i in batch]))
        whole = module()
        torch.testing.assert_close(got, whole[batch], **EXACT)
        weights = torch.randn(len(batch), dtype=torch.float64)
        params = list(module.parameters())
        got_grads = torch.autograd.grad((got * weights).sum(), params, allow_unused=True)
        want_grads = torch.autograd.grad((whole[batch] * weights).sum(), params, allow_unused=True)
        for g, w in zip(got_grads, want_grads):
            assert (g is None) == (w is None) or torch.count_nonzero(g if g is not None else w) == 0
            if g is not None and w is not None:
                torch.testing.assert_close(g, w, **EXACT)
    assert batched.report.unbatched == 0, batched.report.unbatched_reason
    assert batched.report.structures == 8 and batched.report.groupings == 1
    assert batched.report.eager_samples == 8


def test_epoch_benchmark_trains_per_sample_networks_in_mini_batches():
    from benchmarks import neuralogic_epoch

    result = neuralogic_epoch.main(["--samples", "6", "--epochs", "1", "--batch", "3"])
    assert result["batch"] == 3 and result["samples"] == 6
    assert result["relational_epoch_ms"] > 0 and result["java_epoch_ms"] > 0

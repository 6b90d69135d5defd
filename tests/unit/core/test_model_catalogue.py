"""Known models' tensor-parallel limits (what the operator refuses at reconcile)."""

from __future__ import annotations

import pytest

from genpool_core.model_catalogue import KNOWN_MODELS, known_shape, tensor_parallel_problem


@pytest.mark.parametrize("size", [2, 4, 8])
def test_smollm2_refuses_sizes_that_do_not_divide_its_3_kv_heads(size: int) -> None:
    problem = tensor_parallel_problem("smollm2-135m", size)
    assert problem is not None
    assert problem.startswith(f"spec.tensorParallelSize: {size} cannot shard smollm2-135m")
    assert "3 KV heads" in problem and "sizes that work: 1, 3" in problem


@pytest.mark.parametrize(
    ("model", "size"),
    [("smollm2-135m", 1), ("smollm2-135m", 3), ("Llama-3.1-8B-Instruct", 1),
     ("Llama-3.1-8B-Instruct", 8), ("Llama-3.1-70B-Instruct", 8)],
)  # fmt: skip
def test_sizes_that_shard_the_model_pass(model: str, size: int) -> None:
    assert tensor_parallel_problem(model, size) is None


def test_llama_70b_names_its_8_kv_heads_and_the_sizes_that_work() -> None:
    problem = tensor_parallel_problem("Llama-3.1-70B-Instruct", 3)
    assert problem is not None and "8 KV heads" in problem
    assert problem.endswith("sizes that work: 1, 2, 4, 8")


def test_a_checkpoint_directory_is_known_by_its_last_component() -> None:
    assert known_shape("checkpoints/Llama-3.1-8B-Instruct/") == known_shape("llama-3.1-8b-instruct")
    assert known_shape("checkpoints/llama-3.1-8b-instruct") is not None


@pytest.mark.parametrize("model", ["my-finetune", "synthetic:tiny", "./model.gguf", "."])
def test_unknown_models_pass_for_the_worker_to_check(model: str) -> None:
    assert known_shape(model) is None
    assert tensor_parallel_problem(model, 7) is None


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_each_parameter_count_is_its_shapes(name: str) -> None:
    # A Llama decoder: embedding, per layer q/k/v/o, a gated MLP and two norms, the final
    # norm, and an LM head of its own unless tied to the embedding.
    shape = KNOWN_MODELS[name]
    hidden, kv_width = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    assert shape.num_heads * shape.head_dim == hidden
    layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * shape.ffn_size + 2 * hidden
    matrix = shape.vocab_size * hidden
    head = 0 if shape.tied_embeddings else matrix
    assert shape.num_params == matrix + shape.num_layers * layer + hidden + head

"""The decoder-only LLM families' tiny cases, stock against generated, for the release worker (llm_release_worker.py).

Imported in a process whose transformers is one side-by-side release (PYTHONPATH); the generated package
of that release is imported by name from the repository.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

# family -> (config class, stock module, base model, causal LM, has a sliding window)
FAMILIES = {
    "llama": ("LlamaConfig", "llama", "LlamaModel", "LlamaForCausalLM", False),
    "qwen2": ("Qwen2Config", "qwen2", "Qwen2Model", "Qwen2ForCausalLM", True),
    "qwen3": ("Qwen3Config", "qwen3", "Qwen3Model", "Qwen3ForCausalLM", True),
    "mistral": ("MistralConfig", "mistral", "MistralModel", "MistralForCausalLM", True),
    "gemma3": ("Gemma3TextConfig", "gemma3", "Gemma3TextModel", "Gemma3ForCausalLM", True),
}
CONFIGS = ("tied", "untied")
# Gemma 3: sliding and full layers mixed (sliding, full, sliding), soft-capping on (stock stores the attention
# cap but passes it to no attention function: equal either way), a query scale that is not head_dim.
GEMMA3 = {"sliding_window_pattern": 2, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 50.0,
          "final_logit_softcapping": 3.0, "hidden_activation": "gelu_pytorch_tanh"}
MASKS = ("padded", "no-mask")


class Family:
    """Stock and generated classes of one family at this process's release."""

    def __init__(self, name: str, release: str, generated: Path | None) -> None:
        config_class, module, self.base, self.lm, self.window = FAMILIES[name]
        import transformers

        self.name, self.v5 = name, int(release.split(".")[0]) >= 5
        # Before 4.43 rope_scaling is {"type", "factor"} only, linear or dynamic (no llama3 scaling).
        self.typed_rope = tuple(int(part) for part in release.split(".")[:2]) < (4, 43)
        self.config_class = getattr(transformers, config_class)
        self.stock = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        package = f"generated_models.{name}.v{release.replace('.', '_')}.modeling_{module}"
        if generated is None:
            self.generated = importlib.import_module(package)
        else:
            spec = importlib.util.spec_from_file_location(f"{package}_override", generated)
            assert spec is not None and spec.loader is not None, generated
            self.generated = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = self.generated
            spec.loader.exec_module(self.generated)

    def config(self, name: str):  # noqa: ANN201
        tied = name == "tied"
        kwargs: dict[str, Any] = dict(vocab_size=61, hidden_size=16, intermediate_size=24, num_attention_heads=4, head_dim=4,
                      num_key_value_heads=2 if tied else 1, num_hidden_layers=2 if tied else 3,
                      max_position_embeddings=64, tie_word_embeddings=tied, attention_dropout=0.1,
                      attn_implementation="eager", pad_token_id=0)
        if self.window:
            kwargs.update(sliding_window=3 if tied else 4, use_sliding_window=True, max_window_layers=1)
        if self.name == "gemma3":  # Gemma 3 adds (the sliding window above is shorter than the sequence)
            kwargs.update(GEMMA3 if tied else {**GEMMA3, "attn_logit_softcapping": None, "final_logit_softcapping": None})
            if tied:  # rope scaling on the global (full-attention) rotary table; 5.x keeps `rope_scaling` for it
                kwargs["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        elif tied:  # rope scaling on: llama3's for Llama, linear for the others
            scaling = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16} if self.name == "llama"
                       else {"rope_type": "linear", "factor": 2.0})
            if self.typed_rope:
                scaling = {"type": "linear", "factor": 2.0}
            if self.v5:
                kwargs["rope_parameters"] = {**scaling, "rope_theta": 10000.0}
            else:
                kwargs["rope_scaling"] = scaling
        return self.config_class(**kwargs)

    def pair(self, class_name: str, config_name: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
        cfg = self.config(config_name)
        torch.manual_seed(seed)
        reference = getattr(self.stock, class_name)(cfg)
        assert reference.config._attn_implementation == "eager", reference.config._attn_implementation
        converted = getattr(self.generated, class_name)(cfg)
        converted.load_state_dict(reference.state_dict(), strict=True)
        return reference, converted

    def build(self, class_name: str, config_name: str = "tied") -> torch.nn.Module:
        torch.manual_seed(0)
        return getattr(self.generated, class_name)(self.config(config_name))


def inputs(mask: str, labels: bool, batch: int = 2, seq: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(1, 61, (batch, seq), generator=generator)}
    if mask == "padded":  # left padding on the first row
        values["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        values["attention_mask"][0, :2] = 0
    if mask == "packed":  # two sequences packed in the first row, no mask: HF reads the positions
        values["position_ids"] = torch.arange(seq).repeat(batch, 1)
        values["position_ids"][0, 3:] -= 3
    if labels:
        values["labels"] = values["input_ids"].clone()
        values["labels"][:, 0] = -100
    return values


def stock_output(output, kwargs: dict) -> torch.Tensor:  # noqa: ANN001
    if "labels" in kwargs:
        return output.loss
    return output.logits if hasattr(output, "logits") else output.last_hidden_state

"""A tiny LLM stack for tests and examples on CPU, with nothing to download.

- :func:`tiny_policy`: TorchRL's ``TransformersWrapper`` around a randomly
  initialised two-layer GPT-2, with transformers' ``ByT5Tokenizer`` (bytes as
  tokens: no vocabulary file);
- :func:`prompt_env`: TorchRL's ``ChatEnv.from_dataloader`` over the prompts
  kept in this package (``prompts.txt``), in ``"text"`` mode;
- :func:`prompts`: those prompts.

Greedy decoding with a fixed number of new tokens makes the tokens a function
of the weights alone: two collectors with the same weights answer a prompt the
same way, and new weights change the answer.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from importlib import resources
from typing import Any

# Notices about TorchRL's and transformers' own calls that a user of this stack cannot act on (set on
# import, in the process that builds the policy): TransformersWrapper's log-probs call torch's
# deprecated size_average; ByT5's tokenizer sees the ChatML template's </s>.
warnings.filterwarnings("ignore", "size_average and reduce args will be deprecated", UserWarning)
warnings.filterwarnings("ignore", "This sequence already has </s>", UserWarning)

#: New tokens per answer (bytes, with ByT5's tokenizer).
NEW_TOKENS = 16


@functools.cache
def prompts() -> tuple[str, ...]:
    """The prompts kept in ``daskcollect/llm/prompts.txt``, one per line."""
    text = resources.files("daskcollect.llm").joinpath("prompts.txt").read_text()
    return tuple(line.strip() for line in text.splitlines() if line.strip())


class PromptLoader:
    """An endless loader of prompt batches, ``{"query": [...]}``, cycling through :func:`prompts`."""

    def __init__(self, batch_size: int, start: int = 0):
        self.batch_size = batch_size
        self._cycle = itertools.islice(itertools.cycle(prompts()), start, None)

    def __iter__(self) -> PromptLoader:
        return self

    def __next__(self) -> dict[str, list[str]]:
        return {"query": list(itertools.islice(self._cycle, self.batch_size))}


def tokenizer() -> Any:
    """transformers' ``ByT5Tokenizer``: bytes as tokens, built with no file."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def tiny_model(seed: int = 0, layers: int = 2, width: int = 32, device: str = "cpu") -> Any:
    """A randomly initialised ``GPT2LMHeadModel`` over ByT5's 384 tokens (2 layers of width 32 by default;
    benchmarks ask for larger ones)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tokenizer()
    # initializer_range 0.5 (GPT-2's is 0.02): a random model whose greedy answers vary with the prompt.
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=2, n_positions=512, vocab_size=len(tok), initializer_range=0.5,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config).eval().to(device)
    # Never padding, end or unknown (ids 0-2): every greedy answer is as long as asked, a function of
    # the weights and the prompt alone. TorchRL's TransformersWrapper passes neither min_new_tokens nor
    # suppress_tokens to generate(), and bad_words_ids does not hold single tokens back here
    # (transformers 5.25), so the model's own generation config says it.
    model.generation_config.suppress_tokens = [tok.pad_token_id, tok.eos_token_id, tok.unk_token_id]
    return model


def tiny_policy(seed: int = 0, new_tokens: int = NEW_TOKENS, layers: int = 2, width: int = 32,
                device: str = "cpu", sample: bool = False) -> Any:  # fmt: skip
    """TorchRL's ``TransformersWrapper`` around :func:`tiny_model`, generating ``new_tokens`` tokens,
    greedily or (``sample=True``) by sampling."""
    from torchrl.modules.llm import TransformersWrapper

    tok = tokenizer()
    generate = {"max_new_tokens": new_tokens, "do_sample": sample}
    return TransformersWrapper(tiny_model(seed, layers, width, device), tokenizer=tok, input_mode="text",
                               generate=True, generate_kwargs=generate, return_log_probs=True,
                               device=device)  # fmt: skip


def prompt_env(batch_size: int = 2, start: int = 0, max_turns: int = 2) -> Any:
    """TorchRL's ``ChatEnv`` over :func:`prompts` (text mode, ChatML template).

    Args:
        batch_size: Dialogs at once.
        start: The first prompt's index (collectors given different starts ask different questions).
        max_turns: Turns per dialog: a ``StepCounter`` ends it (done) and the next prompt starts.
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv

    env = ChatEnv.from_dataloader(
        dataloader=PromptLoader(batch_size, start),
        batch_size=batch_size,
        input_mode="text",
        tokenizer=tokenizer(),
        template_kwargs={"chat_template_name": "chatml_format"},
    )
    return env.append_transform(StepCounter(max_steps=max_turns))

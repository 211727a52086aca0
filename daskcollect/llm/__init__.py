"""LLM rollouts on Dask: TorchRL ``LLMCollector``s in Dask actors (:class:`DaskLLMCollector`).

:mod:`daskcollect.llm.testing` has a tiny model, tokenizer and prompt env that
run on CPU with nothing to download.
"""

from __future__ import annotations

from daskcollect.llm.collector import DaskLLMCollector

__all__ = ["DaskLLMCollector"]

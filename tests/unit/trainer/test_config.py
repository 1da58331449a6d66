"""TrainerConfig: the job it names on the LLMProxy's Suspend/Resume, on a LoRA fleet shared by several jobs."""

from __future__ import annotations

import pytest

from rollart_trainer.config import TrainerConfig


def test_llmproxy_job_id_is_a_name_or_empty() -> None:
    base = dict(insecure_disable_auth=True, job_key="k" * 32)
    assert TrainerConfig(**base).llmproxy_job_id == ""
    assert TrainerConfig(**base, llmproxy_job_id="job-b").llmproxy_job_id == "job-b"
    with pytest.raises(ValueError, match="llmproxy_job_id"):
        TrainerConfig(**base, llmproxy_job_id="bad id!")

"""EnvManagerConfig: the job its turns name on a shared LoRA fleet is a job name or empty."""

from __future__ import annotations

import pytest

from rollart_envmanager.config import EnvManagerConfig


def test_llmproxy_job_id_is_a_name_or_empty() -> None:
    assert EnvManagerConfig(insecure_disable_auth=True).llmproxy_job_id == ""
    assert EnvManagerConfig(insecure_disable_auth=True, llmproxy_job_id="job-b").llmproxy_job_id == "job-b"
    with pytest.raises(ValueError, match="llmproxy_job_id"):
        EnvManagerConfig(insecure_disable_auth=True, llmproxy_job_id="two words")

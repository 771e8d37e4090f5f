"""Prefill/decode disaggregation (Splitwise, DistServe, Mooncake): separate pools of prefill and
decode replicas, each request's KV cache moved from one to the other over a link."""

"""Weight sync: learner rank 0 broadcasts full weights, bucket by bucket, into every vLLM engine.

publisher.py (learner) -> process_group.py (TCP store + gloo/NCCL group) -> receiver.py / vllm_extension.py
(engines); rendezvous.py holds the Redis keys both sides meet through. See README.md in this folder.
"""

"""The learner pool: staleness-corrected GRPO on FSDP2 ranks, fed by the Redis buffer, pushing weights to engines.

job.py               the sections a learner process uses (its entry point: sr1/entrypoints/learner.py)
loop.py              take -> train -> publish -> checkpoint -> ack: the coordinator's loop and the followers'
coordinator.py       the step coordinator (rank 0): prompt feeding, batches, heartbeats, the bound, publishing, acks
steps.py             what every rank does in a step: train, stop vote, checkpoint, metrics row; its setup
trainer.py           one optimisation step on all ranks
step_metrics.py      the step's statistics, reduced over ranks, and the metrics it returns
algorithms/          GRPO, Dr. GRPO, RLOO, REINFORCE++, PPO, the off-policy corrections, KL, shaping
model.py             the HF model under fully_shard, AdamW
packing.py           token-budget packed micro-batches
attention.py         packed attention: flash varlen, FlexAttention, per-sequence SDPA
chunked_logprobs.py  log-probs without full logits
minibatches.py       PPO epochs and mini-batches
critic.py            PPO's value model
memory.py            the memory check before the first step
distributed.py       init_distributed() and World
checkpoint.py        streamed HF safetensors + DCP resume
tracking.py          metrics.jsonl (+ wandb) on rank 0
stop.py              the SIGTERM/SIGINT stop flag
"""

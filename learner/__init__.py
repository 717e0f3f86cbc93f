"""The learner pool: staleness-corrected GRPO on FSDP2 ranks, fed by the Redis buffer, pushing weights to engines.

The root holds the RL step (loop -> coordinator -> steps -> trainer) and what it is made of; two wings hold what the
step stands on: `execution/`, how a step runs on this device, and `checkpoints/`, how the run survives a restart.
Every module, in the order a reader meets them (tests/unit/learner/test_map.py keeps this list whole):

job.py                    the sections a learner process uses (its entry point: sr1/entrypoints/learner.py)
settings.py               the `learner` config section: the algorithm, its correction, FSDP2 training, checkpoints
distributed.py            init_distributed() and World; Hold keeps the followers company while rank 0 waits alone
stop.py                   the SIGTERM/SIGINT stop flag
loop.py                   take -> train -> publish -> checkpoint -> ack: the coordinator's loop and the followers'
coordinator.py            the step coordinator (rank 0): prompt feeding, batches, heartbeats, the bound, publish, acks
steps.py                  what every rank does in a step: train, stop vote, checkpoint, metrics row; its setup
trainer.py                one optimisation step on all ranks
minibatches.py            PPO epochs and mini-batches, each split over the ranks and packed
packing.py                token-budget packed micro-batches, and the log-probs of their targets
model.py                  the HF model under fully_shard, AdamW
lora.py                   LoRA adapters on a frozen base (PEFT): what the engines get, the merged export
critic.py                 PPO's value model
algorithms/               GRPO, Dr. GRPO, RLOO, REINFORCE++, PPO, the off-policy corrections, KL, shaping
  settings.py             the `learner.algorithm` and `learner.correction` members
  base.py                 the contract: advantages for a batch of groups, the per-token PPO-clip loss
  grpo.py                 GRPO and Dr. GRPO
  rloo.py                 RLOO: the leave-one-out baseline
  reinforce.py            REINFORCE++ and REINFORCE++-baseline
  ppo.py                  PPO with a critic and GAE over the sampled tokens
  corrections.py          the off-policy corrections: none, truncated IS, IcePop, decoupled PPO
  kl.py                   the KL estimators and the coefficient's controller
  shaping.py              DAPO's reward shaping
step_metrics.py           the step's statistics, reduced over ranks, and the metrics it returns
probe.py                  the probe each publish carries: proof that an engine samples from the weights it claims
tracking.py               metrics.jsonl (+ wandb) on rank 0
execution/                how a step runs on this device, decided once before the model loads
  plan.py                 the plan: attention kernel, compiled layers, log-prob head, checkpointing, FSDP2 settings
  device.py               pinned asynchronous host-to-device copies; the guard against host syncs inside the step
  attention.py            packed attention: flash varlen, torch varlen, FlexAttention, per-sequence SDPA
  attention_choice.py     `attention: auto`: the fastest kernel present, timed on this GPU
  compiled.py             decoder layers' forward through torch.compile
  recompute.py            activation checkpointing by policy: full, selective
  memory.py               one rank's peak estimate, the checkpointing policy that fits, the check before the first step
  chunked_logprobs.py     log-probs without full logits: fp32 chunks (the CPU's head)
  fused_head.py           the fused log-prob head: one compiled pass per chunk of compute-dtype logits (CUDA's)
checkpoints/              durability: what a restart resumes from, and what outlives the run
  checkpointer.py         save and resume: the HF directory, DCP state, partial -> renamed, prune, `latest`
  files.py                durable writes, the manifest of sizes and CRC-32s, the check before loading
  hf_weights.py           safetensors streamed one parameter at a time, the config and tokenizer files beside them
  adapters.py             the LoRA side: the PEFT adapter, the merged final export, the adapters' DCP state
  safety_net.py           a failed save is survived once; a second in a row stops the run
"""

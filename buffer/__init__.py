"""The replay buffer: records, their codec, the Redis buffer of a run, the staleness bound and admission under it, stats
and the `sr1 buffer` views."""

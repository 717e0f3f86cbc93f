"""The replay buffer: records, their codec, the Redis buffer of a run, admission, stats and the `sr1 buffer` views."""

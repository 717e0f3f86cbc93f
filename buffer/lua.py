"""The buffer's Lua scripts: each write that must not be torn runs as one script inside Redis.

A crash between two separate calls could lose or duplicate a group (a group put but its prompt still leased, a group
acked but still counted in flight); as one script, each of these writes happens whole or not at all.
"""

# the streams' consumer groups (the scripts below name them too)
GENERATORS = "generators"
LEARNER = "learner"

# KEYS: prompts, released_ids, inflight, counters. ARGV: n, then n triples (group_id, release_version, payload).
# Returns one entry id per prompt ("" where the group_id was released before and is skipped).
RELEASE = """
local n = tonumber(ARGV[1])
local ids = {}
local released = 0
for i = 0, n - 1 do
  local gid = ARGV[2 + 3 * i]
  if redis.call('SADD', KEYS[2], gid) == 1 then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'gid', gid, 'd', ARGV[4 + 3 * i])
    redis.call('ZADD', KEYS[3], ARGV[3 + 3 * i], gid)
    released = released + 1
  else
    ids[#ids + 1] = ''
    redis.call('HINCRBY', KEYS[4], 'duplicate_releases', 1)
  end
end
if released > 0 then redis.call('HINCRBY', KEYS[4], 'released', released) end
return ids
"""

# Runs inside MULTI right after `XADD groups * gid <group_id> d <payload>`, so the stream's last entry is that
# group (the payload itself never passes through Lua, where large values cost more than the stream write).
# KEYS: inflight, counters. ARGV: group_id.
# A released group that left the pipeline for good without being trained (dead-lettered) leaves the in-flight set and
# is counted as `abandoned`, so the prompt feeder releases one more in its place (buffer/admission.py). Counted only if
# it was in flight: an entry nobody released (a stray payload) must not raise the admission limit.
ABANDON = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'abandoned', 1)
  return 1
end
return 0
"""

# KEYS: groups, prompts, put_ids, counters, rate key. ARGV: group_id, prompt entry id or "", rate ttl.
# Finishes the prompt either way; a group put before is removed again at once (nobody can have read it: MULTI)
# and counted as a duplicate. Returns 1 if the group was added, 0 for a duplicate.
PUT = """
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[2], 'generators', ARGV[2])
  redis.call('XDEL', KEYS[2], ARGV[2])
end
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  redis.call('XDEL', KEYS[1], last[1][1])
  redis.call('HINCRBY', KEYS[4], 'duplicates', 1)
  return 0
end
redis.call('HINCRBY', KEYS[4], 'produced', 1)
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[5], ARGV[3])
return 1
"""

# KEYS: groups, inflight, counters, rate key, trained. ARGV: rate ttl, then pairs (entry id, group_id or ""); an unknown
# group_id is read from the entry before it is deleted.
ACK = """
local acked = 0
for i = 2, #ARGV, 2 do
  local id, gid = ARGV[i], ARGV[i + 1]
  if gid == '' then
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if e[1] then
      local f = e[1][2]
      for k = 1, #f, 2 do if f[k] == 'gid' then gid = f[k + 1] end end
    end
  end
  acked = acked + redis.call('XACK', KEYS[1], 'learner', id)
  redis.call('XDEL', KEYS[1], id)
  redis.call('SREM', KEYS[5], id)
  if gid ~= '' then redis.call('ZREM', KEYS[2], gid) end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[3], 'consumed', acked)
  redis.call('INCRBY', KEYS[4], acked)
  redis.call('EXPIRE', KEYS[4], ARGV[1])
end
return acked
"""

# KEYS: groups, inflight, released_ids, put_ids, trained, counters. ARGV: pairs (entry id, group_id).
# Takes back groups a learner trained on in steps a crash lost: their entries leave the stream and every set, so the
# prompts can be released again (the caller releases them in the same transaction).
RECALL = """
local n = 0
for i = 1, #ARGV, 2 do
  local id, gid = ARGV[i], ARGV[i + 1]
  redis.call('XACK', KEYS[1], 'learner', id)
  redis.call('XDEL', KEYS[1], id)
  redis.call('SREM', KEYS[5], id)
  redis.call('ZREM', KEYS[2], gid)
  redis.call('SREM', KEYS[3], gid)
  redis.call('SREM', KEYS[4], gid)
  n = n + 1
end
if n > 0 then
  redis.call('HINCRBY', KEYS[6], 'released', -n)
  redis.call('HINCRBY', KEYS[6], 'produced', -n)
  redis.call('HINCRBY', KEYS[6], 'recalled', n)
end
return n
"""

# KEYS: durable, released_ids, put_ids, counters. ARGV: group_ids.
# Takes back groups acked by a checkpoint a resume could not use (buffer/durable.py): they leave the durable record and
# the released and put sets, so their prompts can be released again (the caller does, in the same transaction), and
# the counters forget them.
RECALL_DURABLE = """
local n = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('SREM', KEYS[2], ARGV[i])
    redis.call('SREM', KEYS[3], ARGV[i])
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[4], 'released', -n)
  redis.call('HINCRBY', KEYS[4], 'produced', -n)
  redis.call('HINCRBY', KEYS[4], 'consumed', -n)
  redis.call('HINCRBY', KEYS[4], 'recalled', n)
end
return n
"""

"""The buffer's Lua scripts: each write that must not be torn runs as one script inside Redis.

A crash between two separate calls could lose or duplicate a group (a group put but its prompt still leased, a group
acked but still counted in flight); as one script, each of these writes happens whole or not at all. Redis keeps that
promise under `maxmemory` too: a script is refused (OOM) before its first write, never half-way.

Each script is also safe to run twice: a write whose reply was lost (a network cut, a Redis restart) is sent again
by the client (buffer/connection.py), so the second run must change nothing the first one did. Each script says what
makes it so; docs/measurements/network-and-redis.md ("Lost replies") lists every write of the buffer.
"""

# the streams' consumer groups (the scripts below name them too)
GENERATORS = "generators"
LEARNER = "learner"

# KEYS: prompts, released_ids, inflight, counters, forgotten_below. ARGV: n, then n quadruples (group_id,
# release_version, the feeder position it comes from or -1, payload).
# Returns one entry id per prompt ("" where the group_id was released before and is skipped).
# Released before: the id is in released_ids (group_id -> position), or its position is below the watermark's
# `position`, under which every position was released (buffer/group_ids.py) and whose ids the set has forgotten.
# Run twice: the group ids are in released_ids after the first run, so the second skips them all (counted as
# duplicate_releases, which is what they are).
RELEASE = """
local n = tonumber(ARGV[1])
local floor = tonumber(redis.call('HGET', KEYS[5], 'position') or '0')
local ids = {}
local released = 0
for i = 0, n - 1 do
  local gid, position = ARGV[2 + 4 * i], tonumber(ARGV[4 + 4 * i])
  if (position < 0 or position >= floor) and redis.call('ZADD', KEYS[2], 'NX', position, gid) == 1 then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'gid', gid, 'd', ARGV[5 + 4 * i])
    redis.call('ZADD', KEYS[3], ARGV[3 + 4 * i], gid)
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
# KEYS: groups, prompts, put_ids, counters, rate key, inflight, forgotten_below. ARGV: group_id, prompt entry id or
# "", rate ttl, the group's release version.
# Finishes the prompt either way; a group put before is removed again at once (nobody can have read it: MULTI)
# and counted as a duplicate. Put before: the id is in put_ids (group_id -> release version), or the group was
# released below the watermark's `version` and is no longer in flight (acked, or dead-lettered), whose id put_ids has
# forgotten (buffer/group_ids.py). Returns 1 if the group was added, 0 for a duplicate.
# Run twice (the whole MULTI): put_ids holds the group id after the first run, so the second XADD is removed again
# and counted as a duplicate; the prompt was finished by the first.
PUT = """
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[2], 'generators', ARGV[2])
  redis.call('XDEL', KEYS[2], ARGV[2])
end
local seen = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not seen and tonumber(ARGV[4]) < tonumber(redis.call('HGET', KEYS[7], 'version') or '0') then
  seen = not redis.call('ZSCORE', KEYS[6], ARGV[1])
end
if seen then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  redis.call('XDEL', KEYS[1], last[1][1])
  redis.call('HINCRBY', KEYS[4], 'duplicates', 1)
  return 0
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'produced', 1)
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[5], ARGV[3])
return 1
"""

# KEYS: groups, inflight, counters, rate key, trained. ARGV: rate ttl, a counter to add the acked count to (`dropped`
# for groups dynamic sampling drops, or ""), then pairs (entry id, group_id or ""); an unknown group_id is read from
# the trained hash, or from the entry before it is deleted.
# Run twice: XACK acks nothing the second time, and every count is of what XACK acked.
# Its first write is XACK, which Redis allows at maxmemory: acking (which frees memory) works in a full Redis.
ACK = """
local acked = 0
for i = 3, #ARGV, 2 do
  local id, gid = ARGV[i], ARGV[i + 1]
  if gid == '' then gid = redis.call('HGET', KEYS[5], id) or '' end
  if gid == '' then
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if e[1] then
      local f = e[1][2]
      for k = 1, #f, 2 do if f[k] == 'gid' then gid = f[k + 1] end end
    end
  end
  acked = acked + redis.call('XACK', KEYS[1], 'learner', id)
  redis.call('XDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[5], id)
  if gid ~= '' then redis.call('ZREM', KEYS[2], gid) end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[3], 'consumed', acked)
  if ARGV[2] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[2], acked) end
  redis.call('INCRBY', KEYS[4], acked)
  redis.call('EXPIRE', KEYS[4], ARGV[1])
end
return acked
"""

# KEYS: dead, counters, stream, inflight, prompt_errors. ARGV: entry id ("" for a group rejected at put without a
# prompt), consumer group, group_id or "", reason, head of the payload, counter, dead-letter maxlen, stream name.
# Moves an entry aside with its reason: dead-letter entry, counter, XACK + XDEL; a group in flight leaves the
# in-flight set and is counted as `abandoned`, so the prompt feeder releases one more in its place
# (buffer/admission.py). Counted abandoned only if it was in flight: an entry nobody released (a stray payload) must
# not raise the admission limit. Returns 1, or 0 when the entry was finished already.
# Run twice: the entry is no longer pending after the first run (XACK returns 0), so the second does nothing.
DEAD_LETTER = """
if ARGV[1] ~= '' then
  if redis.call('XACK', KEYS[3], ARGV[2], ARGV[1]) == 0 then return 0 end
  redis.call('XDEL', KEYS[3], ARGV[1])
  if ARGV[2] == 'generators' then redis.call('HDEL', KEYS[5], ARGV[1]) end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[7], '*', 'reason', ARGV[4], 'gid', ARGV[3], 'stream', ARGV[8],
  'entry_id', ARGV[1], 'head', ARGV[5])
redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
if ARGV[3] ~= '' and redis.call('ZREM', KEYS[4], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'abandoned', 1)
end
return 1
"""

# KEYS: groups, trained. ARGV: the entry ids of groups a step trained on.
# Keeps each group's id in the trained hash (until the checkpoint that acks it) and deletes its entry from the stream:
# the pending entry stays (XACK still finishes it), the payload leaves Redis, so Redis holds the payloads of the groups
# not trained yet only, whatever the checkpoint interval. An entry already gone keeps the id it was marked with.
# Run twice: the second run finds the entries gone and sets nothing new.
# Its first write is XDEL, which Redis allows at maxmemory: marking (which frees memory) works in a full Redis.
MARK_TRAINED = """
local gids = {}
for i = 1, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  local gid = ''
  if e[1] then
    local f = e[1][2]
    for k = 1, #f, 2 do if f[k] == 'gid' then gid = f[k + 1] end end
  end
  gids[i] = gid
end
for i = 1, #ARGV do redis.call('XDEL', KEYS[1], ARGV[i]) end
for i = 1, #ARGV do
  if gids[i] ~= '' then redis.call('HSET', KEYS[2], ARGV[i], gids[i]) end
end
return #ARGV
"""

# KEYS: groups, inflight, put_ids, trained, counters, prompts. ARGV: quadruples (entry id, group_id, release version,
# prompt payload).
# Takes back groups a learner trained on in steps a crash lost, and releases their prompts anew at the given version:
# their entries leave the stream and the trained and put sets, so the prompts are generated again under their own
# group ids (training the old groups again would break the staleness bound by the number of lost steps). `released`
# stays as it is (one release replaced by another; released_ids is left as it is: the feeder never releases them
# again); `produced` goes down, `recalled` up. Returns how many.
# Run twice: only entries still in the trained hash are recalled (HDEL returns 0 the second time), so nothing is
# released twice.
RECALL = """
local n = 0
for i = 1, #ARGV, 4 do
  local id, gid = ARGV[i], ARGV[i + 1]
  if redis.call('HDEL', KEYS[4], id) == 1 then
    redis.call('XACK', KEYS[1], 'learner', id)
    redis.call('XDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[3], gid)
    redis.call('XADD', KEYS[6], '*', 'gid', gid, 'd', ARGV[i + 3])
    redis.call('ZADD', KEYS[2], ARGV[i + 2], gid)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[5], 'produced', -n)
  redis.call('HINCRBY', KEYS[5], 'recalled', n)
end
return n
"""

# KEYS: version, version_time. ARGV: version, time, "reset" or "".
# Published versions only go up: a publish sent during a network cut may reach Redis after a newer one (the client
# gave up and sent it again; TCP delivered the first copy late), and must not take the version back. "reset" lets a
# learner that starts a fresh run on a used namespace set 0 (it warns). Run twice: the same value is set again.
PUBLISH_VERSION = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) < current and ARGV[3] ~= 'reset' then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

# KEYS: staleness histogram, the sorted set of recent calls (call id -> the caller's clock). ARGV: how long a call id
# is kept (s), this call's id, the caller's time (s), then pairs (staleness, token count).
# Run twice: the first run adds the call id, so the second adds nothing. One key for every call: the ids older than
# the ttl are trimmed (last, so that ZADD is the first write and a full Redis refuses the script whole). The time is
# the caller's, sent with the call (a resent call sends the same), not Redis's TIME: the run's ACL does not grant it.
RECORD_CONSUMED = """
if redis.call('ZSCORE', KEYS[2], ARGV[2]) then return 0 end
local now = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now, ARGV[2])
for i = 4, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
return 1
"""

# KEYS: the evaluation's shard count, the request list. ARGV: ttl, shards, then one request per shard.
# Run twice: the shard count exists after the first run (SET NX fails), so no request is queued twice.
REQUEST_EVALUATION = """
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[1]) then return 0 end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
"""

# KEYS: the request list, the worker's taken list. A worker answers one request at a time and removes it from its
# taken list when it posts the answer, so a request still there is one whose pop lost its reply: it is returned
# again instead of a new one (otherwise it would sit there until the worker restarts, and its evaluation time out).
POP_EVALUATION = """
local held = redis.call('LINDEX', KEYS[2], 0)
if held then return held end
return redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
"""

# KEYS: the worker's taken list, the malformed counter. ARGV: the request as popped.
# Run twice: the request is gone from the taken list after the first run, so it is counted once.
DROP_MALFORMED_EVALUATION = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then redis.call('INCR', KEYS[2]) end
return 1
"""

# KEYS: durable, put_ids, counters, prompts, inflight. ARGV: triples (group_id, release version, prompt payload).
# Takes back groups acked by a checkpoint a resume could not use (buffer/durable.py) and releases their prompts anew at
# the given version: they leave the durable record and the put set, so the prompts are generated again under their own
# group ids. `released` stays as it is (one release replaced by another; released_ids is left as it is); `produced`
# and `consumed` go down, `recalled` up. Returns how many.
# Run twice: only groups still in the durable record are recalled (ZREM returns 0 the second time), so nothing is
# released twice.
RECALL_DURABLE = """
local n = 0
for i = 1, #ARGV, 3 do
  local gid = ARGV[i]
  if redis.call('ZREM', KEYS[1], gid) == 1 then
    redis.call('ZREM', KEYS[2], gid)
    redis.call('XADD', KEYS[4], '*', 'gid', gid, 'd', ARGV[i + 2])
    redis.call('ZADD', KEYS[5], ARGV[i + 1], gid)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'produced', -n)
  redis.call('HINCRBY', KEYS[3], 'consumed', -n)
  redis.call('HINCRBY', KEYS[3], 'recalled', n)
end
return n
"""

# KEYS: released_ids, put_ids, inflight, forgotten_below. ARGV: position, version.
# Raises the watermark (each field only goes up) and forgets what it covers (buffer/group_ids.py): the released ids
# of feeder positions below `position` (a release from such a position is skipped by RELEASE without the set), and
# the put ids of groups released below `version` that are no longer in flight (a put of one is a duplicate by PUT
# without the set). Ids released without a position (-1) are kept. Returns how many ids it forgot.
# Run twice: the watermark is already there and nothing is left to forget.
FORGET_IDS = """
local position = math.max(tonumber(ARGV[1]), tonumber(redis.call('HGET', KEYS[4], 'position') or '0'))
local version = math.max(tonumber(ARGV[2]), tonumber(redis.call('HGET', KEYS[4], 'version') or '0'))
redis.call('HSET', KEYS[4], 'position', position, 'version', version)
local n = redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, '(' .. position)
for _, gid in ipairs(redis.call('ZRANGE', KEYS[2], '-inf', '(' .. version, 'BYSCORE')) do
  if not redis.call('ZSCORE', KEYS[3], gid) then
    redis.call('ZREM', KEYS[2], gid)
    n = n + 1
  end
end
return n
"""

# KEYS: released_ids, put_ids, version.
# A namespace written by an sr1 that kept both as plain sets: each becomes a sorted set, the released ids without a
# position (-1: kept), the put ids at the published version (forgotten once a checkpoint's version passes it and they
# are no longer in flight). Run twice (or on every open): they are sorted sets already and nothing changes.
UPGRADE_ID_SETS = """
local scores = {-1, tonumber(redis.call('GET', KEYS[3]) or '0')}
local n = 0
for k = 1, 2 do
  if redis.call('TYPE', KEYS[k]).ok == 'set' then
    local ids = redis.call('SMEMBERS', KEYS[k])
    redis.call('DEL', KEYS[k])
    for i = 1, #ids, 1000 do
      local args = {}
      for j = i, math.min(i + 999, #ids) do
        args[#args + 1] = scores[k]
        args[#args + 1] = ids[j]
      end
      redis.call('ZADD', KEYS[k], unpack(args))
    end
    n = n + #ids
  end
end
return n
"""

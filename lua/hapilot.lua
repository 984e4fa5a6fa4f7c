-- hapilot.lua: the HAProxy-side Lua companion of the hapilot agent.
--
-- HAProxy builds each response's "backend server status %Tr" line itself,
-- natively, and hands it to this script's converter:
--   http-after-response set-var-fmt(txn.hapilot) "%b %s %ST %Tr"
--   http-after-response set-var(txn.hapilot_n) var(txn.hapilot),lua.hapilot_record
-- (http-after-response: it runs for HAProxy's own 502/503/504 too, which
-- http-response never sees.)
-- The converter counts the line in a bounded in-memory table, where
-- identical lines share one entry, and returns at once. A task flushes the
-- table to the agent every flush interval over core.tcp(), one connection
-- per batch, one "backend server status tr count" line per distinct
-- response. A response never waits for the agent: when the agent is
-- unreachable the batch is dropped and counted, and the task backs off;
-- when the table is full, responses with a line not already in it are
-- dropped and counted. Load it with lua-load-per-thread: each thread then
-- has its own copy, table and task, and no thread waits for another's
-- Lua lock.
--
-- Why a converter that counts, and not an http-res action that appends:
-- HAProxy 2.6 builds a txn object of several tables for every Lua action call,
-- and a table holding one string per response keeps Lua's collector busy.
-- A converter gets just the string, and the counts table stays small (its
-- size is the number of distinct lines, not of responses). On the 2-core
-- machine where it was measured (`hapilot-bench bench overhead`), that took the
-- companion from 0.65-0.71x plain HAProxy's throughput to 0.82-0.85x.
--
-- Settings come from the environment (HAProxy's global `setenv`):
--   HAPILOT_LUA_AGENT     host:port of `hapilot run --lua-listen` (127.0.0.1:12346),
--                         or a unix socket, unix@/path, for --lua-listen unix:/path
--   HAPILOT_LUA_FLUSH_MS  flush interval in milliseconds (100)
--   HAPILOT_LUA_MAX       bound on distinct lines between flushes (20000)
--
-- Written in the Lua that both 5.3 (HAProxy 2.6) and 5.1 (gopher-lua, in
-- hapilot's tests) run.

local function setting(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  return v
end

local agent = setting("HAPILOT_LUA_AGENT", "127.0.0.1:12346")
-- host:port for TCP; anything else (unix@/path) is passed whole to
-- connect(), which takes HAProxy's address prefixes.
local host, port = string.match(agent, "^(.+):(%d+)$")
port = tonumber(port)
local flush_ms = tonumber(setting("HAPILOT_LUA_FLUSH_MS", "100"))
local max_lines = tonumber(setting("HAPILOT_LUA_MAX", "20000"))
local backoff_max_ms = 5000

-- counts maps a line to its responses since the last flush; distinct is
-- its number of keys, pending the sum of its values. The figures are
-- locals, not table fields: the converter runs on every response.
local counts, distinct, pending = {}, 0, 0
local sent, dropped_full, dropped_down, failed_flushes = 0, 0, 0, 0

-- hapilot_stats is global so that tests (and a curious operator's Lua
-- console) can read the figures.
function hapilot_stats()
  return {
    recorded = sent + dropped_down + pending, buffered = pending, sent = sent,
    dropped_full = dropped_full, dropped_down = dropped_down, failed_flushes = failed_flushes,
  }
end

-- record is the converter: it returns 1 when it counted the response and
-- 0 when the table was full (an integer is the cheapest value for
-- set-var to store).
local function record(line)
  local n = counts[line]
  if n ~= nil then
    counts[line] = n + 1
  elseif distinct < max_lines then
    distinct = distinct + 1
    counts[line] = 1
  else
    dropped_full = dropped_full + 1
    return 0
  end
  pending = pending + 1
  return 1
end

-- flush sends the counted lines; it returns true when the agent took them.
local function flush()
  if pending == 0 then return true end
  local batch, n = counts, pending
  counts, distinct, pending = {}, 0, 0
  local out, i = {}, 0
  for line, c in pairs(batch) do
    i = i + 1
    out[i] = line .. " " .. c
  end
  local sock = core.tcp()
  sock:settimeout(1)
  local ok
  if port then
    ok = sock:connect(host, port)
  else
    ok = sock:connect(agent)
  end
  if ok then
    ok = sock:send(table.concat(out, "\n") .. "\n")
  end
  sock:close()
  if ok then
    sent = sent + n
    return true
  end
  dropped_down = dropped_down + n
  failed_flushes = failed_flushes + 1
  return false
end

local function flush_loop()
  local backoff = 0
  while true do
    core.msleep(flush_ms + backoff)
    if flush() then
      backoff = 0
    else
      backoff = math.min(backoff * 2 + flush_ms, backoff_max_ms)
    end
  end
end

core.register_converters("hapilot_record", record)
core.register_task(flush_loop)

-- hapilot.lua: the HAProxy-side Lua companion of the hapilot agent.
--
-- An http-res action records each response's "backend server status %Tr"
-- line into a bounded in-memory buffer and returns at once. HAProxy builds
-- the line itself, natively, with
--   http-response set-var-fmt(txn.hapilot) "%b %s %ST %Tr"
-- so the action costs one variable read and one table store. A task flushes the
-- buffer to the agent every flush interval over core.tcp(), one connection
-- per batch, one "backend server status tr" line per response. A response
-- never waits for the agent: when the agent is unreachable the batch is
-- dropped and counted, and the task backs off; when the buffer is full new
-- responses are dropped and counted.
--
-- Settings come from the environment (HAProxy's global `setenv`):
--   HAPILOT_LUA_AGENT     host:port of `hapilot run --lua-listen` (127.0.0.1:12346)
--   HAPILOT_LUA_FLUSH_MS  flush interval in milliseconds (100)
--   HAPILOT_LUA_MAX       buffer bound in responses (20000)
--
-- Written in the Lua that both 5.3 (HAProxy 2.6) and 5.1 (gopher-lua, in
-- hapilot's tests) run.

local function setting(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  return v
end

local agent = setting("HAPILOT_LUA_AGENT", "127.0.0.1:12346")
local host, port = string.match(agent, "^(.+):(%d+)$")
port = tonumber(port)
local flush_ms = tonumber(setting("HAPILOT_LUA_FLUSH_MS", "100"))
local max_buffer = tonumber(setting("HAPILOT_LUA_MAX", "20000"))
local backoff_max_ms = 5000

local buf = {}
local count = 0

-- hapilot_stats is global so that tests (and a curious operator's Lua
-- console) can read it.
hapilot_stats = { recorded = 0, sent = 0, dropped_full = 0, dropped_down = 0, failed_flushes = 0 }

local function record(txn)
  if count >= max_buffer then
    hapilot_stats.dropped_full = hapilot_stats.dropped_full + 1
    return
  end
  local line = txn:get_var("txn.hapilot")
  if line == nil then return end -- the set-var-fmt rule is missing
  count = count + 1
  buf[count] = line
  hapilot_stats.recorded = hapilot_stats.recorded + 1
end

-- flush sends the buffered lines; it returns true when the agent took them.
local function flush()
  if count == 0 then return true end
  local lines, n = buf, count
  buf, count = {}, 0
  local sock = core.tcp()
  sock:settimeout(1)
  local ok = sock:connect(host, port)
  if ok then
    ok = sock:send(table.concat(lines, "\n", 1, n) .. "\n")
  end
  sock:close()
  if ok then
    hapilot_stats.sent = hapilot_stats.sent + n
    return true
  end
  hapilot_stats.dropped_down = hapilot_stats.dropped_down + n
  hapilot_stats.failed_flushes = hapilot_stats.failed_flushes + 1
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

core.register_action("hapilot-record", { "http-res" }, record, 0)
core.register_task(flush_loop)

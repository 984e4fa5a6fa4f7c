-- ratio.lua: drain a serving server whose 5xx rate is at least three
-- times its backend's, with at least 10 errors and 200 requests, and at
-- most one per backend per step. Simple, readable, no statistics: a
-- starting point to adapt.
--
--   hapilot run --policy lua --policy-file examples/policies/ratio.lua

function decide(obs)
  local actions = {}
  for _, b in ipairs(obs.backends) do
    local req, err = 0, 0
    for _, s in ipairs(b.servers) do
      if s.serving then
        req = req + s.requests
        err = err + s.err_5xx
      end
    end
    if req > 0 then
      local rate = err / req
      local worst = nil
      for _, s in ipairs(b.servers) do
        if s.serving and s.requests >= 200 and s.err_5xx >= 10 and s.error_rate >= 3 * rate then
          if worst == nil or s.error_rate > worst.error_rate then worst = s end
        end
      end
      if worst ~= nil then
        table.insert(actions, { action = "drain", backend = b.name, server = worst.name,
          reason = string.format("5xx %.1f%% against %.1f%% for the backend", 100 * worst.error_rate, 100 * rate) })
      end
    end
  end
  return actions
end

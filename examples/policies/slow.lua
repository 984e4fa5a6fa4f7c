-- slow.lua: halve the weight of a serving server whose p95 is more than
-- three times its backend's median p95 (and above 50 ms), down to a
-- quarter of its configured weight; give the weight back once it is fast
-- again. Shows set_weight and a policy keeping its own memory in a global.
--
--   hapilot run --policy lua --policy-file examples/policies/slow.lua

cut = cut or {}  -- "backend/server" -> true while this policy holds a cut

local function median(values)
  table.sort(values)
  return values[math.floor((#values + 1) / 2)]
end

function decide(obs)
  local actions = {}
  for _, b in ipairs(obs.backends) do
    local p95s = {}
    for _, s in ipairs(b.servers) do
      if s.serving and s.requests >= 100 then table.insert(p95s, s.p95_ms) end
    end
    if #p95s >= 2 then
      local med = median(p95s)
      for _, s in ipairs(b.servers) do
        local key = b.name .. "/" .. s.name
        if s.serving and s.requests >= 100 then
          if s.p95_ms > 3 * med and s.p95_ms > 50 and s.weight > math.max(1, math.floor(s.initial_weight / 4)) then
            cut[key] = true
            table.insert(actions, { action = "set_weight", backend = b.name, server = s.name,
              weight = math.max(1, math.floor(s.weight / 2)), reason = string.format("p95 %d ms, median %d ms", s.p95_ms, med) })
          elseif cut[key] and s.p95_ms <= 2 * med and s.weight < s.initial_weight then
            cut[key] = nil
            table.insert(actions, { action = "set_weight", backend = b.name, server = s.name,
              weight = s.initial_weight, reason = "fast again" })
          end
        end
      end
    end
  end
  return actions
end

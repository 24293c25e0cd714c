-- Argo CD health of a Runbook Evaluator: kstatus conditions first (Stalled,
-- Reconciling), then Degraded and Ready, and observedGeneration so an edit
-- shows Progressing until Runbook has seen it.
local hs = { status = "Progressing", message = "Waiting for Runbook to reconcile it" }
if obj.status == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.message = "Waiting for Runbook to see generation " .. generation
  return hs
end
local conditions = {}
for _, c in ipairs(obj.status.conditions or {}) do
  if c.type ~= nil then
    conditions[c.type] = c
  end
end
local function said(c, fallback)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return c.reason or fallback
end
local stalled, degraded = conditions["Stalled"], conditions["Degraded"]
if stalled ~= nil and stalled.status == "True" then
  return { status = "Degraded", message = said(stalled, "Stalled") }
end
if degraded ~= nil and degraded.status == "True" then
  return { status = "Degraded", message = said(degraded, "Degraded") }
end
local reconciling = conditions["Reconciling"] or conditions["Progressing"]
if reconciling ~= nil and reconciling.status == "True" then
  return { status = "Progressing", message = said(reconciling, "Reconciling") }
end
local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  return { status = "Healthy", message = said(ready, "Ready") }
end
if ready ~= nil and ready.status == "False" then
  return { status = "Degraded", message = said(ready, "not ready") }
end
return hs

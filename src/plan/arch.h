// The model spec the planner projects with: models::build_spec through the family registry
// (models/family.h), for families spool runs and for families it only plans (a registered
// family without a loader), so `spool plan` can answer "does it fit" before anything is
// downloaded. The family's describe() / plan_notes() say what the figures assume.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/spec.h"

namespace spool::plan {

struct PlanModel {
  models::ModelSpec spec;
  bool runnable = true;            // spool generate can load this model_type
  std::string architecture;        // one line: what the KV and expert figures assume
  std::vector<std::string> notes;  // approximations the projection makes for this family
};

/// model_type values `spool plan` projects without spool being able to run them (registered
/// families without a loader).
const std::vector<std::string>& plan_only_model_types();

/// The spec of `ck`'s model: build_spec for supported model_types (runnable), a planning spec
/// for plan_only_model_types() (not runnable). Throws spool::Error for any other model_type
/// (listing both lists) and for missing/invalid config fields.
PlanModel plan_model(const io::Checkpoint& ck);

}  // namespace spool::plan

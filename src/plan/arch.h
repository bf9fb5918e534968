// The model spec the planner projects with: models::build_spec through the family registry
// (models/family.h), so `spool plan` can answer "does it fit" before anything is downloaded.
// The family's describe() / plan_notes() say what the figures assume.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/spec.h"

namespace spool::plan {

struct PlanModel {
  models::ModelSpec spec;
  std::string architecture;        // one line: what the KV and expert figures assume
  std::vector<std::string> notes;  // approximations the projection makes for this family
};

/// The spec of `ck`'s model (models::build_spec), its family's description and planner notes.
/// Throws spool::Error for a model_type no family registers (listing those spool runs) and for
/// missing/invalid config fields.
PlanModel plan_model(const io::Checkpoint& ck);

}  // namespace spool::plan

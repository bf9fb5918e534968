#include "plan/arch.h"

#include <algorithm>

#include "common/error.h"
#include "models/family.h"

namespace spool::plan {

PlanModel plan_model(const io::Checkpoint& ck) {
  const io::Config& c = ck.config();
  const std::string mt = c.get_string("model_type", "");
  const models::Family* f = models::family_of_model_type(mt);
  if (f == nullptr) {
    std::string list;
    for (const auto& t : models::supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    fail("%s/config.json: unknown or unsupported model_type '%s' (spool runs: %s)", ck.dir().c_str(),
         mt.empty() ? "(missing)" : mt.c_str(), list.c_str());
  }
  PlanModel m;
  m.spec = models::build_spec(ck);
  if (f->describe != nullptr) m.architecture = f->describe(m.spec);
  if (f->plan_notes != nullptr) m.notes = f->plan_notes(c);
  return m;
}

}  // namespace spool::plan

#include "plan/arch.h"

#include <algorithm>

#include "common/error.h"
#include "models/family.h"

namespace spool::plan {

const std::vector<std::string>& plan_only_model_types() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const models::Family* f : models::families())
      if (f->load == nullptr) out.insert(out.end(), f->model_types.begin(), f->model_types.end());
    return out;
  }();
  return v;
}

PlanModel plan_model(const io::Checkpoint& ck) {
  const io::Config& c = ck.config();
  const std::string mt = c.get_string("model_type", "");
  const models::Family* f = models::family_of_model_type(mt);
  if (f == nullptr) {
    std::string list;
    for (const auto& t : models::supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    std::string plan_list;
    for (const auto& t : plan_only_model_types()) plan_list += (plan_list.empty() ? "" : ", ") + t;
    fail("%s/config.json: unknown or unsupported model_type '%s' (spool runs: %s; spool plan also projects: %s)",
         ck.dir().c_str(), mt.empty() ? "(missing)" : mt.c_str(), list.c_str(), plan_list.empty() ? "(none)" : plan_list.c_str());
  }
  PlanModel m;
  m.spec = models::build_spec(ck);
  m.runnable = f->load != nullptr;
  if (f->describe != nullptr) m.architecture = f->describe(m.spec);
  if (f->plan_notes != nullptr) m.notes = f->plan_notes(c);
  if (!m.runnable) m.notes.push_back("prefill workspace is estimated with spool's own kernels' buffers for this geometry");
  return m;
}

}  // namespace spool::plan

#include "models/model.h"

#include "dist/expert_parallel.h"

#include "common/error.h"
#include "dist/comm.h"
#include "models/bind.h"
#include "models/decoder.h"
#include "models/family.h"
#include "ops/cpu_backend.h"

namespace spool::models {

std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, std::shared_ptr<ops::Backend> backend) {
  ModelSpec spec = build_spec(*ckpt);
  const Family* f = family_named(spec.family);
  if (f == nullptr) fail("%s: unknown model family '%s'", ckpt->dir().c_str(), spec.family.c_str());
  return f->load(std::move(ckpt), std::move(spec), std::move(backend));
}

std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, std::shared_ptr<ops::Backend> backend,
                                  std::shared_ptr<lora::LoraSet> adapters) {
  if (adapters == nullptr || adapters->empty()) return load_model(std::move(ckpt), std::move(backend));
  if (backend->device() != ops::Device::kCpu && backend->device() != ops::Device::kCuda)
    fail("LoRA: the %s backend has no LoRA products (run with --device cpu or cuda)", backend->name());
  std::unique_ptr<Model> m;
  {
    LoraBindScope scope(adapters.get());
    m = load_model(std::move(ckpt), std::move(backend));
  }
  adapters->check_all_bound();
  m->lora = std::move(adapters);
  return m;
}

std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, ops::ThreadPool* pool) {
  return load_model(std::move(ckpt), std::make_shared<ops::CpuBackend>(pool));
}

void Model::mtp_forward(const MtpStep&) {
  fail("this model has no multi-token-prediction head (open the checkpoint keeping it: --spec mtp)");
}

void Model::set_comm(dist::Comm* comm) {
  if (comm != nullptr && comm->size() > 1) fail("this model type does not run expert-parallel over several ranks");
}

void Model::set_expert_parallel(const dist::ExpertParallel& ep) {
  if (ep.active()) fail("this model type does not run expert-parallel over several ranks");
}

int Model::serve_experts() { fail("this model type does not run expert-parallel over several ranks"); }

void Model::set_expert_predictor(std::shared_ptr<const experts::ExpertPredictor> p, bool) {
  if (p != nullptr) fail("this model cannot use an expert predictor (it has no routed experts read through a router)");
}

void Model::router_as_linear(int layer, std::vector<float>*, std::vector<float>*) {
  fail("layer %d has no router a predictor can start from", layer);
}

uint64_t workspace_arena_bytes(const ModelSpec& spec, int64_t T, int max_seqs) {
  return DecoderModel::arena_bytes(spec, T, max_seqs);
}

}  // namespace spool::models

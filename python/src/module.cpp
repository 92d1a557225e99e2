// flashjit._flashjit: the nanobind extension under the Python package flashjit. The public API
// and its documentation are python/flashjit/__init__.py; this module does the work, in files by
// role:
//   errors.*     library errors -> flashjit.Error and its subclasses (with .code)
//   runtimes.*   places ("cpu", "cuda:N"), one Runtime per place, the caller's CUDA context
//   arrays.*     DLPack arrays in (no copies), checked against each other -> the problem
//   attention.*  attention (forward), attention_backward, config_for, prepared calls (the torch
//                fast path: checks and kernel once, then launches with data pointers)
//   tools.*      show, devices
//   tune.*       tune (keyword arguments -> tuner/tune_run.hpp's request; its report -> a dict)
//
// Arrays on the CPU run on the CPU backend, arrays on CUDA device n on the CUDA backend of
// device n; one Runtime per (backend, device) is kept for the life of the process.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "attention.hpp"
#include "errors.hpp"
#include "generator/render.hpp"
#include "runtime/runtime.hpp"
#include "runtimes.hpp"
#include "tools.hpp"
#include "tune.hpp"
#include "tuner/reference.hpp"

#ifndef FLASHJIT_VERSION
#define FLASHJIT_VERSION "0.1.0"
#endif

NB_MODULE(_flashjit, m) {
  namespace nb = nanobind;
  using namespace flashjit::python;
  m.doc() = "flashjit's extension module; use the package flashjit (python/flashjit/__init__.py)";
  register_exceptions(m);
  // Prepared calls live in module-level caches and in autograd graphs that scripts leave in their
  // globals: Python may not collect them before the extension goes at exit, which is harmless
  // (nothing needs releasing then) but nanobind would report each as a leak.
  nb::set_leak_warnings(false);

  m.attr("__version__") = FLASHJIT_VERSION;
  m.def("have_cpu_backend", &flashjit::have_cpu_backend);
  m.def("generator_version", [] { return flashjit::generator_version(); });
  // The relative L2 error a correct backward kernel's gradients stay under, by storage type
  // (tuner/reference.hpp): the tests and the benchmark check against it.
  m.def("gradient_tolerance", [](const std::string& dtype) {
    return flashjit::gradient_tolerance(unwrap(flashjit::parse_dtype(dtype)));
  });

  def_attention(m);
  m.def("decode", &decode, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("block_table").none(), nb::arg("seqlens_k").none(), nb::arg("out").none(),
        nb::arg("lse").none(), nb::arg("want_lse"), nb::arg("causal"), nb::arg("scale").none(),
        nb::arg("config").none(), nb::arg("stream"), nb::arg("synchronize"), nb::arg("framework"),
        nb::arg("check_tables") = false);
  m.def("attention_backward", &attention_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("o"), nb::arg("lse").none(), nb::arg("do"), nb::arg("dq").none(),
        nb::arg("dk").none(), nb::arg("dv").none(), nb::arg("causal"), nb::arg("scale").none(),
        nb::arg("layout"), nb::arg("deterministic"), nb::arg("config").none(), nb::arg("stream"),
        nb::arg("synchronize"), nb::arg("framework"), nb::arg("variant").none() = nb::none(),
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0,
        nb::arg("max_seqlen_k") = 0);
  // Prepared calls (python/flashjit/_torch.py keeps one per shapes/strides/dtypes/device/options).
  nb::class_<Prepared>(m, "Prepared")
      .def("forward", &Prepared::forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
           nb::arg("lse"), nb::arg("alibi_slopes"), nb::arg("stream"))
      .def("backward", &Prepared::backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
           nb::arg("lse"), nb::arg("do"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
           nb::arg("alibi_slopes"), nb::arg("stream"))
      .def_prop_ro("config", [](const Prepared& p) { return p.kernel().config().to_string(); })
      .def_prop_ro("device", [](const Prepared& p) { return p.place().to_string(); })
      .def_prop_ro("problem", [](const Prepared& p) { return p.problem().to_string(); });
  m.def("prepare_attention", &prepare_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"), nb::arg("scale").none(),
        nb::arg("layout"), nb::arg("config").none(), nb::arg("variant").none(),
        nb::arg("alibi_slopes").none());
  m.def("prepare_attention_backward", &prepare_attention_backward, nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("do"), nb::arg("dq"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("causal"), nb::arg("scale").none(), nb::arg("layout"),
        nb::arg("deterministic"), nb::arg("config").none(), nb::arg("variant").none() = nb::none(),
        nb::arg("alibi_slopes").none() = nb::none());
  m.def("config_for", &config_for, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal"),
        nb::arg("scale").none(), nb::arg("layout"), nb::arg("config").none(), nb::arg("pass_"),
        nb::arg("deterministic"), nb::arg("variant").none(), nb::arg("alibi_slopes").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"));
  m.def("block_mask_stats", &block_mask_stats, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("layout"), nb::arg("config").none(),
        nb::arg("pass_"), nb::arg("deterministic"), nb::arg("variant").none());
  m.def("show", &show, nb::arg("batch"), nb::arg("heads"), nb::arg("kv_heads").none(),
        nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("head_dim"), nb::arg("dtype"),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("layout"), nb::arg("config").none(),
        nb::arg("arch").none(), nb::arg("device"), nb::arg("pass_"), nb::arg("deterministic"));
  m.def("devices", &devices);
  m.def("tune", &tune, nb::arg("spec"));
  m.def("clear_runtimes", [] { runtimes().clear(); });
}

// graphsafe.debug: the process-wide debug report as Python data, and its tools.
#include "common.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

namespace graphsafe::python {

nb::dict finding_dict(const debug::Finding& f) {
  nb::dict d;
  d["kind"] = f.kind;
  d["request"] = f.request;
  d["graph"] = f.graph;
  d["site"] = f.site;
  d["message"] = f.message;
  d["fix"] = f.fix;
  d["count"] = f.count;
  return d;
}

nb::list finding_list(const std::vector<debug::Finding>& v) {
  nb::list l;
  for (const auto& f : v) l.append(finding_dict(f));
  return l;
}

namespace {
using namespace nb::literals;
}  // namespace

void bind_debug(nb::module_& m) {
  m.def("findings", [] { return finding_list(debug::findings()); },
        "The findings so far, each a dict {kind, request, graph, site, message, fix, count}");
  m.def("finding_count", &debug::finding_count);
  m.def("clear_findings", &debug::clear_findings);
  m.def("report", [] { return nb::module_::import_("json").attr("loads")(debug::report_json()); },
        "The JSON report (docs/debug_mode.md) as a dict");
  m.def("report_text", &debug::report_text);
  m.def("report_json", &debug::report_json);
  m.def("write_report", &debug::write_report, "path"_a);
  m.def("env_enabled", &debug::env_enabled, "Whether GRAPHSAFE_DEBUG turns debug mode on");
  m.def("report_finding",
        [](std::string_view kind, std::string_view message, std::string_view fix, std::string_view request,
           std::string_view graph, std::optional<std::string> site) {
          PythonSite here;
          std::string where = site ? *site : std::string();
          if (!site) {
            auto loc = here.loc();
            std::string f = loc.file_name();
            if (auto slash = f.find_last_of('/'); slash != std::string::npos) f = f.substr(slash + 1);
            where = f + ":" + std::to_string(loc.line()) + " (" + loc.function_name() + ")";
          }
          debug::report_finding(kind, where, message, fix, request, graph);
        },
        "kind"_a, "message"_a, "fix"_a = "", "request"_a = "", "graph"_a = "", nb::arg("site").none() = nb::none(),
        "Add a finding (site defaults to the calling Python line)");
  m.def("probe",
        [](nb::handle arena, nb::callable fn, nb::handle a, nb::handle b, nb::handle stream) {
          Arena& ar = nb::cast<Arena&>(arena);
          nb::object f = nb::borrow(fn);
          auto found = debug::probe(
              ar, to_stream(ar.backend(), stream),
              [&f](const Bindings& bb) { f(nb::cast(bb, nb::rv_policy::copy)); }, to_bindings(a), to_bindings(b));
          return finding_list(found);
        },
        "arena"_a, "fn"_a, "a"_a, "b"_a, nb::arg("stream").none() = nb::none(),
        "Capture fn twice (bindings a and b) and report everything that differs: values frozen at capture");
}

}  // namespace graphsafe::python

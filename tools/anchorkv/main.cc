// anchorkv: command-line front end of the anchorkv library.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "anchorkv/status.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"anchorkv: AnchorKV anchor-residual KV-cache compression"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "anchorkv 0.1.0");
  namespace cli = anchorkv::cli;
  cli::register_demo(app);
  cli::register_codec_mse(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks measured side by side in one run");
  bench->require_subcommand(1);
  cli::register_bench(bench);
  cli::register_bench_persist(bench);
  cli::register_bench_runtime(bench);
  cli::register_serve(app);
  cli::register_compare(app);
  cli::register_logits(app);
  cli::register_run(app);
  cli::register_eval(app);
  cli::register_analyze(app);
  cli::register_dump_kv(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const anchorkv::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

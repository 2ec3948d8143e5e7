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
  anchorkv::cli::register_demo(app);
  anchorkv::cli::register_codec_mse(app);
  anchorkv::cli::register_bench(app);
  anchorkv::cli::register_bench_persist(app);
  anchorkv::cli::register_serve(app);
  anchorkv::cli::register_compare(app);
  anchorkv::cli::register_logits(app);
  anchorkv::cli::register_runtime(app);
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

#pragma once
// examples/cli.hpp — flag parsing shared by the example programs (CLI11): parse_or_exit.
//
//   CLI::App app{"sample: ..."};
//   app.add_option("--tokens", o.tokens, "...");
//   loom_examples::parse_or_exit(app, argc, argv);   // --help: prints and exits 0; bad flag: exits 2
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace loom_examples {

/// The text of a CLI11 parse error for a one-line message. CLI11 prefixes a failed check with
/// the option's name ("--steps: " + the validator's text), so a validator that names the flag
/// itself reads "--steps: --steps must be ..."; this drops the repeated prefix.
inline std::string parse_error_text(const CLI::ParseError& e) {
  std::string text = e.what();
  const std::size_t colon = text.find(": ");
  if (colon != std::string::npos && colon > 0 && text.compare(colon + 2, colon, text, 0, colon) == 0 &&
      text.compare(0, 1, "-") == 0)
    text.erase(0, colon + 2);
  return text;
}

/// Parses argv into `app`. On --help (or --help-all) prints the help and exits with status 0;
/// on a bad or missing flag prints "<program>: error: <what>; run <program> --help for the
/// flags" to stderr and exits with status 2 (the examples' "bad input" status). <program> is
/// argv[0]'s file name. Returns normally when the flags parsed.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : app.get_name();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s; run %s --help for the flags\n", program.c_str(), parse_error_text(e).c_str(),
                 program.c_str());
    std::exit(2);
  }
}

}  // namespace loom_examples

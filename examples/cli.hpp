#pragma once
// examples/cli.hpp — flag parsing shared by the example programs (CLI11): parse_or_exit.
//
//   CLI::App app{"sample: ..."};
//   app.add_option("--tokens", o.tokens, "...");
//   loom_examples::parse_or_exit(app, argc, argv);   // --help: prints and exits 0; bad flag: exits 2
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace loom_examples {

/// The text of a CLI11 parse error for a one-line message. CLI11 prefixes a failed check with
/// the option's name ("--steps: " + the validator's text), so a validator that names the flag
/// itself reads "--steps: --steps must be ..."; this drops the repeated prefix. A one-value
/// flag given twice ("--log-dir: At Most 1 required but received 2") says so, naming every alias
/// of it ("--steps and --train-iters name one flag"). A value that is
/// not of the flag's type ("Could not convert: --tokens = abc") names the type `app` declares
/// for it ("--tokens: 'abc' is not a whole number; pass a whole number"), and every alias of the
/// flag ("--micro-batch / --micro-batch-size: ...").
inline std::string parse_error_text(const CLI::ParseError& e, const CLI::App* app = nullptr) {
  std::string text = e.what();
  constexpr std::string_view convert = "Could not convert: ";
  if (text.compare(0, convert.size(), convert) == 0) {
    const std::size_t eq = text.find(" = ", convert.size());
    if (eq != std::string::npos) {
      std::string flag = text.substr(convert.size(), eq - convert.size());
      const std::string value = text.substr(eq + 3);
      const CLI::Option* opt = app ? app->get_option_no_throw(flag) : nullptr;
      if (opt && opt->get_lnames().size() > 1) {  // an alias: name each ("--micro-batch / --micro-batch-size")
        flag.clear();
        for (const std::string& n : opt->get_lnames()) flag += (flag.empty() ? "--" : " / --") + n;
      }
      const std::string type = opt ? opt->get_type_name() : std::string();
      const std::string kind = type.rfind("INT", 0) == 0    ? "a whole number"
                               : type.rfind("UINT", 0) == 0 ? "a whole number >= 0"
                               : type.rfind("FLOAT", 0) == 0 ? "a number"
                               : type.empty()                ? "a valid value"
                                                             : "a valid " + type;
      return flag + ": '" + value + "' is not " + kind + "; pass " + kind;
    }
  }
  constexpr std::string_view twice = ": At Most 1 required but received ";
  if (const std::size_t at = text.find(twice); at != std::string::npos) {
    const std::string flag = text.substr(0, at), count = text.substr(at + twice.size());
    const CLI::Option* opt = app ? app->get_option_no_throw(flag) : nullptr;
    if (opt && opt->get_lnames().size() > 1) {  // an alias: "--steps,--train-iters"
      std::string names;
      for (const std::string& n : opt->get_lnames()) names += (names.empty() ? "--" : " and --") + n;
      return names + " name one flag, given " + count + " times in all; it takes one value: pass one of them once";
    }
    return flag + " was given " + count + " times; it takes one value: pass it once";
  }
  const std::size_t colon = text.find(": ");
  if (colon != std::string::npos && colon > 0 && text.compare(colon + 2, colon, text, 0, colon) == 0 &&
      text.compare(0, 1, "-") == 0)
    text.erase(0, colon + 2);
  return text;
}

/// Levenshtein distance between `a` and `b` (insertions, deletions, substitutions; one each).
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// For each argument `app` did not expect (after a failed parse) that looks like a misspelt long
/// flag ("--stpes", "--micro_batch=4"), " (did you mean --steps?)": the closest of `app`'s long
/// flags within 2 edits, or within a third of its length for long names. Empty if none is close.
inline std::string flag_suggestions(const CLI::App& app) {
  std::string out;
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("--", 0) != 0) continue;
    const std::string given = extra.substr(0, extra.find('='));
    std::string best;
    std::size_t best_distance = std::max<std::size_t>(2, given.size() / 3) + 1;
    for (const CLI::Option* opt : app.get_options())
      for (const std::string& name : opt->get_lnames()) {
        const std::size_t d = edit_distance(given, "--" + name);
        if (d < best_distance) best_distance = d, best = "--" + name;
      }
    if (!best.empty()) out += " (" + given + ": did you mean " + best + "?)";
  }
  return out;
}

/// Parses argv into `app`. On --help (or --help-all) prints the help and exits with status 0;
/// on a bad or missing flag prints "<program>: error: <what>; run <program> --help for the
/// flags" to stderr and exits with status 2 (the examples' "bad input" status); an unknown long
/// flag close to a known one is followed by "(--stpes: did you mean --steps?)". <program> is
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
    std::fprintf(stderr, "%s: error: %s%s; run %s --help for the flags\n", program.c_str(),
                 parse_error_text(e, &app).c_str(), flag_suggestions(app).c_str(), program.c_str());
    std::exit(2);
  }
}

}  // namespace loom_examples

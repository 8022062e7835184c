// The layout rules of docs/architecture.md ("CUDA code"), checked on the source tree rather than
// remembered:
//   - a kernel lives in the module whose code launches it: every Launch* function a module's
//     src/<module>/cuda/*.h declares is called from that module's sources only (its own tests
//     and benchmarks may call it too);
//   - modules meet through published headers: no CMakeLists.txt under src/ or tests/ names
//     another module's src/ folder, and no source includes into another module's src/.
// Torch-free; reads the repository (SLIME_SOURCE_DIR).
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// `text` without its // comments (a kernel named in a comment is no call).
std::string StripLineComments(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t c = text.find("//", pos);
    if (c == std::string::npos) {
      out.append(text, pos, std::string::npos);
      break;
    }
    out.append(text, pos, c - pos);
    pos = text.find('\n', c);
    if (pos == std::string::npos) break;
  }
  return out;
}

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Whether `word` occurs in `text` as a whole identifier.
bool ContainsWord(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool starts = at == 0 || !IsWordChar(text[at - 1]);
    const size_t after = at + word.size();
    if (starts && (after == text.size() || !IsWordChar(text[after]))) return true;
  }
  return false;
}

// Whether `text` holds `path` followed by anything but more of a name ("/src/model/cuda",
// "/src/model)", not "/src/modelx").
bool NamesPath(const std::string& text, const std::string& path) {
  for (size_t at = text.find(path); at != std::string::npos; at = text.find(path, at + 1)) {
    const size_t after = at + path.size();
    if (after == text.size() || !IsWordChar(text[after])) return true;
  }
  return false;
}

bool IsSource(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cc" || ext == ".h" || ext == ".cu" || ext == ".cuh";
}

// Every file under `dir` (recursively) that `keep` accepts.
template <typename Keep>
std::vector<fs::path> FilesUnder(const fs::path& dir, Keep keep) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && keep(entry.path())) out.push_back(entry.path());
  }
  return out;
}

// The module of a path under src/<m>/, tests/<m>/, bench/<m>/ or include/slime/<m>/ ("" for
// anything else, e.g. a top-level CMakeLists.txt).
std::string ModuleOf(const fs::path& root, const fs::path& file) {
  const fs::path rel = fs::relative(file, root);
  std::vector<std::string> parts;
  for (const fs::path& part : rel) parts.push_back(part.string());
  if (parts.size() < 3) return "";
  if (parts[0] == "src" || parts[0] == "tests" || parts[0] == "bench") return parts[1];
  if (parts[0] == "include" && parts[1] == "slime" && parts.size() >= 4) return parts[2];
  return "";
}

std::vector<std::string> Modules(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(root / "src")) {
    if (entry.is_directory()) out.push_back(entry.path().filename().string());
  }
  return out;
}

struct Source {
  fs::path path;
  std::string module;
  std::string code;  // without // comments
};

std::vector<Source> Sources(const fs::path& root) {
  std::vector<Source> out;
  for (const char* top : {"src", "tests", "bench", "include"}) {
    for (const fs::path& p : FilesUnder(root / top, IsSource)) {
      out.push_back(Source{p, ModuleOf(root, p), StripLineComments(Read(p))});
    }
  }
  return out;
}

TEST(SourceLayoutTest, EveryKernelIsLaunchedFromItsOwnModule) {
  const fs::path root = slime::testing::SourceDir();
  ASSERT_TRUE(fs::exists(root / "src")) << root;
  const std::vector<Source> sources = Sources(root);
  const std::regex decl(R"(\bint\s+(Launch\w+)\s*\()");
  int kernels = 0;
  for (const std::string& module : Modules(root)) {
    const auto headers = FilesUnder(root / "src" / module / "cuda",
                                    [](const fs::path& p) { return p.extension() == ".h"; });
    for (const fs::path& header : headers) {
      const std::string text = StripLineComments(Read(header));
      for (std::sregex_iterator m(text.begin(), text.end(), decl), end; m != end; ++m) {
        const std::string name = (*m)[1];
        ++kernels;
        for (const Source& file : sources) {
          if (file.module == module || !ContainsWord(file.code, name)) continue;
          ADD_FAILURE() << fs::relative(file.path, root).string() << " calls " << name << " of "
                        << fs::relative(header, root).string()
                        << ": a kernel lives in the module whose code launches it "
                           "(docs/architecture.md, \"CUDA code\")";
        }
      }
    }
  }
  EXPECT_GT(kernels, 10) << "no kernel declarations found under src/*/cuda";
}

TEST(SourceLayoutTest, NoTargetOrSourceReachesIntoAnotherModulesSrc) {
  const fs::path root = slime::testing::SourceDir();
  const std::vector<std::string> modules = Modules(root);
  ASSERT_FALSE(modules.empty()) << root;
  int checked = 0;
  for (const char* top : {"src", "tests", "bench"}) {
    for (const fs::path& file : FilesUnder(root / top, [](const fs::path& p) {
           return p.filename() == "CMakeLists.txt" || IsSource(p);
         })) {
      const std::string owner = ModuleOf(root, file);
      if (owner.empty()) continue;  // top-level wiring
      const bool cmake = file.filename() == "CMakeLists.txt";
      const std::string text = cmake ? Read(file) : StripLineComments(Read(file));
      ++checked;
      for (const std::string& other : modules) {
        if (other == owner) continue;
        // A target's include path into src/<other>, or a module's source including from it.
        if (cmake) {
          EXPECT_FALSE(NamesPath(text, "/src/" + other))
              << fs::relative(file, root).string() << " names src/" << other
              << "/: use the module's published headers (include/slime/" << other << "/)";
        } else if (std::string(top) == "src") {
          EXPECT_EQ(text.find("#include \"../" + other + "/"), std::string::npos)
              << fs::relative(file, root).string() << " includes from src/" << other << "/";
        }
      }
    }
  }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace slime::model

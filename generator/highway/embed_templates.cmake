# Writes OUT: a C++ source defining g3::hwygen::FUNCTION(), the text of each
# file in FILES keyed by its base name. Run at build time, so the files stay
# real files in the tree (readable, diffable) while the binary that writes
# them out (`g3attn generate`) does not need the source tree. FROM names the
# folder in the generated comment.
set(body "// Generated at build time from ${FROM}: do not edit.\n#include <string>\n#include <utility>\n#include <vector>\n\nnamespace g3::hwygen {\n\nconst std::vector<std::pair<std::string, std::string>>& ${FUNCTION}() {\n  static const std::vector<std::pair<std::string, std::string>> files = {\n")
foreach(f ${FILES})
  get_filename_component(name ${f} NAME)
  file(READ ${f} text)
  # Raw string literals are limited to 64 KiB chunks by some compilers; split
  # into pieces and let adjacent literals concatenate.
  string(LENGTH "${text}" len)
  set(pieces "")
  set(pos 0)
  while(pos LESS len)
    string(SUBSTRING "${text}" ${pos} 8000 piece)
    string(APPEND pieces "R\"G3EMBED(${piece})G3EMBED\"\n")
    math(EXPR pos "${pos} + 8000")
  endwhile()
  string(APPEND body "      {\"${name}\",\n${pieces}},\n")
endforeach()
string(APPEND body "  };\n  return files;\n}\n\n}  // namespace g3::hwygen\n")
file(WRITE ${OUT}.tmp "${body}")
file(RENAME ${OUT}.tmp ${OUT})

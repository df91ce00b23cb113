// core/files: atomic writes and tree removal.
#include "core/files.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace orchard {
namespace {

using test::TempDir;

TEST(Files, AtomicWriteReplacesWholeFileAndLeavesNoTemporary) {
  TempDir dir;
  std::string path = dir.file("a.txt");
  atomic_write(path, std::string("first version, longer"));
  atomic_write(path, std::string("second"));
  EXPECT_EQ(test::read_text(path), "second");
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

TEST(Files, FailedWriteKeepsTheOldFile) {
  TempDir dir;
  std::string path = dir.file("keep.txt");
  atomic_write(path, std::string("old"));
  EXPECT_THROW(
      atomic_write(path, [](int) { throw UserError("disk on fire"); }),
      UserError);
  EXPECT_EQ(test::read_text(path), "old");
  EXPECT_THROW(
      atomic_write(dir.file("no/such/dir/x"), std::string("x")), UserError);
}

// What a killed atomic_write left (<path>.tmp.<pid> of a process that has
// ended) is removed; a running process's, another file's and names that
// are not a pid are kept.
TEST(Files, StaleTemporariesOfEndedProcessesAreRemoved) {
  TempDir dir;
  const pid_t child = ::fork();
  if (child == 0)
    ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string ended = std::to_string(child);
  const std::string running = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{
           "t.json.tmp." + ended,
           "t.json.tmp." + running,
           "t.json.tmp.x1",
           "t.json.tmp.",
           "u.json.tmp." + ended,
           "t.json"})
    dir.write(name, "x");
  EXPECT_EQ(remove_stale_temporaries(dir.file("t.json")), 1);
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.json.tmp." + ended)));
  for (const std::string& name : std::vector<std::string>{
           "t.json.tmp." + running,
           "t.json.tmp.x1",
           "t.json.tmp.",
           "u.json.tmp." + ended,
           "t.json"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(name))) << name;
  EXPECT_EQ(remove_stale_temporaries(dir.file("t.json")), 0);
  EXPECT_EQ(remove_stale_temporaries(dir.file("none/t.json")), 0);
}

TEST(Files, RemoveTreeRemovesNestedFoldersButNotLinkTargets) {
  TempDir dir;
  TempDir outside;
  std::string kept = outside.write("kept.txt", "still here");
  dir.write("t/a/b/c.txt", "x");
  dir.write("t/a/d.txt", "y");
  dir.write("t/e.txt", "z");
  ::symlink(outside.path().c_str(), dir.file("t/link").c_str());
  EXPECT_TRUE(remove_tree(dir.file("t")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("t")));
  EXPECT_EQ(test::read_text(kept), "still here");
  EXPECT_TRUE(remove_tree(dir.file("never-existed")));
  dir.write("single.txt", "1");
  EXPECT_TRUE(remove_tree(dir.file("single.txt")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("single.txt")));
}

} // namespace
} // namespace orchard

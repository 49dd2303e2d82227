package io.qmf.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * Delta's log store for tables on a local or mounted POSIX file system ({@code file:}),
 * safe for several JVMs writing one table, without a process forked per commit.
 *
 * <p>Delta's default there ({@code HDFSLogStore}) renames a temporary file with Hadoop's
 * {@code FileContext}, whose local file system asks a forked {@code readlink} process for
 * the link status of both paths: two forks of the driver JVM per commit (the commit file and
 * its checksum), a third of a small commit's time (measured in docs/performance.md).
 *
 * <p>This store writes the content to a hidden temporary file in the same folder, then
 * creates the version file as a hard link to it: {@code link(2)} fails when the name exists,
 * atomically, so a second writer of version N gets the {@link FileAlreadyExistsException}
 * Delta's commit protocol expects, and a reader sees the whole file or none. A file Delta
 * overwrites on purpose ({@code _last_checkpoint}) is moved over the old one atomically.
 * Hadoop's local file system keeps a checksum beside each file it wrote ({@code
 * .NAME.crc}); one left from an earlier content of a name is removed, so Hadoop's readers
 * never check new bytes against an old checksum. Reads and listings are {@link
 * HadoopFileSystemLogStore}'s.
 */
public class LinkingLogStore extends HadoopFileSystemLogStore {

  public LinkingLogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(
      Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    java.nio.file.Path target = local(path, hadoopConf);
    java.nio.file.Path folder = target.getParent();
    Files.createDirectories(folder);
    java.nio.file.Path temp =
        folder.resolve("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      Files.write(temp, LogLines.encode(actions), StandardOpenOption.CREATE_NEW);
      if (Boolean.TRUE.equals(overwrite)) {
        Files.deleteIfExists(sidecar(target));
        Files.move(
            temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        return;
      }
      try {
        // A second writer of this version gets FileAlreadyExistsException, passed on as it
        // is: Delta's commit checks what the first one wrote and retries.
        Files.createLink(target, temp);
      } catch (UnsupportedOperationException | IOException e) {
        if (e instanceof FileAlreadyExistsException) {
          throw (FileAlreadyExistsException) e;
        }
        throw new IOException(
            "cannot commit "
                + target
                + ": its file system cannot create a hard link (how this store refuses a"
                + " second writer of a version); set spark.delta.logStore.file.impl="
                + "io.delta.storage.HDFSLogStore for this folder",
            e);
      }
      Files.deleteIfExists(sidecar(target)); // left by whoever deleted this name before
    } finally {
      Files.deleteIfExists(temp);
    }
  }

  /** The local file behind {@code path}; any other file system is refused. */
  private static java.nio.file.Path local(Path path, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    if (!(fs instanceof LocalFileSystem) && !(fs instanceof RawLocalFileSystem)) {
      throw new IOException(
          LinkingLogStore.class.getName()
              + " writes to local file systems only, not "
              + path
              + " ("
              + fs.getClass().getName()
              + ")");
    }
    return Paths.get(fs.makeQualified(path).toUri());
  }

  /** Hadoop's local checksum file of {@code file}. */
  private static java.nio.file.Path sidecar(java.nio.file.Path file) {
    return file.resolveSibling("." + file.getFileName() + ".crc");
  }

  /**
   * True, as for {@code HDFSLogStore}: this store's own writes appear whole, but Delta asks
   * this of the folder for the files it writes itself, and a checkpoint written in place on
   * a local file system would be visible half written to a reader listing the log. True
   * has Delta write a checkpoint under a temporary name and rename it.
   */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return true;
  }
}

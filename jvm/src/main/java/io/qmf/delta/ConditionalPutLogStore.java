package io.qmf.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for tables in an S3 bucket that several JVMs write (several drivers,
 * jobs and notebooks committing to one table).
 *
 * <p>Delta commits version N by creating {@code _delta_log/N.json}, and relies on the store
 * to refuse that create when another writer made N first: Delta then checks the other
 * commit for conflicts and retries at N+1. Delta's own S3 store ({@code
 * S3SingleDriverLogStore}) checks and writes under a lock held in its own JVM only, so two
 * JVMs can both write N and the later silently replaces the earlier: a lost commit.
 *
 * <p>This store creates a version file with an S3 conditional PUT ({@code If-None-Match: *},
 * Hadoop 3.5's {@code fs.option.create.conditional.overwrite}): the store itself refuses the
 * second create (HTTP 412), which becomes the {@link FileAlreadyExistsException} Delta's
 * commit protocol expects. The option is mandatory ({@code must}): a file system that cannot
 * send it fails the commit instead of overwriting. The store must honour the header (AWS S3
 * since August 2024, versitygw). Files Delta overwrites on purpose ({@code _last_checkpoint})
 * are plain PUTs; reads and listings are those of {@link HadoopFileSystemLogStore}.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {

  /** Hadoop's create option for "only if absent" (S3A: PUT with If-None-Match: *). */
  public static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  private static final String REMOTE_FILE_CHANGED =
      "org.apache.hadoop.fs.s3a.RemoteFileChangedException";

  public ConditionalPutLogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(
      Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    byte[] content = LogLines.encode(actions);
    FileSystem fs = path.getFileSystem(hadoopConf);
    if (Boolean.TRUE.equals(overwrite)) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(content);
      }
      return;
    }
    try {
      createIfAbsent(fs, path, content);
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      // S3A's own check before the upload saw the object.
      refused(fs, path, content, e);
    } catch (IOException e) {
      if (!isPreconditionFailure(e)) {
        throw e;
      }
      refused(fs, path, content, e);
    }
  }

  private static void createIfAbsent(FileSystem fs, Path path, byte[] content)
      throws IOException {
    FSDataOutputStream out;
    try {
      out =
          (FSDataOutputStream)
              fs.createFile(path)
                  .overwrite(false)
                  .recursive()
                  .must(CONDITIONAL_CREATE, true)
                  .build();
    } catch (IllegalArgumentException | UnsupportedOperationException e) {
      throw new IOException(
          "cannot commit "
              + path
              + ": its file system ("
              + fs.getClass().getName()
              + ") cannot create a file only if it is absent ("
              + CONDITIONAL_CREATE
              + "), and writing without it could overwrite another writer's commit",
          e);
    }
    try (FSDataOutputStream stream = out) {
      stream.write(content); // S3A uploads at close(): that is where S3 says 412
    }
  }

  /**
   * The store refused the create: the version exists. Unless it holds exactly these bytes
   * (an earlier attempt of this very write landed, e.g. a PUT retried after its answer was
   * lost; a commit's bytes include its own commitInfo and transaction id), another writer
   * made it first.
   */
  private static void refused(FileSystem fs, Path path, byte[] content, IOException cause)
      throws FileAlreadyExistsException {
    if (holds(fs, path, content)) {
      return;
    }
    FileAlreadyExistsException e = new FileAlreadyExistsException(path.toString());
    e.initCause(cause);
    throw e;
  }

  private static boolean holds(FileSystem fs, Path path, byte[] content) {
    try (InputStream in = fs.open(path)) {
      return Arrays.equals(in.readNBytes(content.length + 1), content);
    } catch (IOException e) {
      return false; // e.g. gone, or a conflicting upload still in flight (S3's 409)
    }
  }

  /**
   * Whether an exception (or a cause of it) is S3's refusal of a conditional PUT: 412
   * PreconditionFailed (S3A: RemoteFileChangedException), or 409 ConditionalRequestConflict
   * (another conditional upload of the same key in progress; S3 asks to retry).
   */
  static boolean isPreconditionFailure(Throwable error) {
    int depth = 0;
    for (Throwable t = error; t != null && depth < 32; t = t.getCause(), depth++) {
      if (REMOTE_FILE_CHANGED.equals(t.getClass().getName())) {
        return true;
      }
      int status = statusCode(t);
      if (status == 412) {
        return true;
      }
      String text = String.valueOf(t.getMessage());
      if (text.contains("PreconditionFailed")
          || text.contains("ConditionalRequestConflict")
          || (status == 409 && "ConditionalRequestConflict".equals(errorCode(t)))) {
        return true;
      }
    }
    return false;
  }

  /** The HTTP status of an AWS SDK service exception (by reflection: no SDK at compile time). */
  private static int statusCode(Throwable t) {
    try {
      Object code = t.getClass().getMethod("statusCode").invoke(t);
      return code instanceof Integer ? (Integer) code : -1;
    } catch (ReflectiveOperationException | RuntimeException e) {
      return -1;
    }
  }

  private static String errorCode(Throwable t) {
    try {
      Object details = t.getClass().getMethod("awsErrorDetails").invoke(t);
      if (details == null) {
        return null;
      }
      Object code = details.getClass().getMethod("errorCode").invoke(details);
      return code == null ? null : code.toString();
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }

  /** An S3 PUT appears whole or not at all. */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}

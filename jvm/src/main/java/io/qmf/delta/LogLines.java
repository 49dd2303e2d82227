package io.qmf.delta;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;

/** The bytes of a Delta log file, shared by this package's log stores. */
final class LogLines {

  private LogLines() {}

  /** The actions one per line, each ended by a newline, as Delta's own stores write them. */
  static byte[] encode(Iterator<String> actions) {
    ByteArrayOutputStream buffer = new ByteArrayOutputStream();
    while (actions.hasNext()) {
      byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
      buffer.write(line, 0, line.length);
    }
    return buffer.toByteArray();
  }
}

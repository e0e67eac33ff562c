//! SPDY/3.1 as Kubernetes' streaming subresources speak it (moby's spdystream, which kubectl
//! and the kubelet use): the frames, the zlib-compressed header blocks with the protocol's
//! dictionary, and the server side of a connection whose client opens the streams. Flow
//! control is not spoken, as spdystream speaks none.

use std::collections::HashMap;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};

/// The protocol's version in every control frame.
const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
/// A data frame's last, or a stream opened half-closed.
const FLAG_FIN: u8 = 0x01;
/// The largest frame read: a frame's length has 24 bits.
const MAX_FRAME: usize = (1 << 24) - 1;

/// The dictionary both ends' header compressors start from (SPDY/3, section 2.6.10.1).
#[rustfmt::skip]
const DICTIONARY: &[u8] = b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\
    \x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eacc\
    ept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\
    \x00\x0daccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthori\
    zation\x00\x00\x00\x0dcache-control\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent\
    -base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\
    \x0econtent-length\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\
    \x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\
    \x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\
    \x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\
    \x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\
    \x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\
    \x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorizat\
    ion\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\
    \x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-enco\
    ding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\
    \x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06me\
    thod\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07v\
    ersion\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\
    \x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin1001012012022052063003\
    02303304305306307402405406407408409410411412413414415416417502504505203 Non-Authorit\
    ative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized4\
    03 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Una\
    vailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu\
    , Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,\
    application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,s\
    dchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// A frame, as far as a server of Kubernetes' streams needs to tell them apart.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    SynStream {
        id: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    SynReply {
        id: u32,
        headers: Vec<(String, String)>,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last: u32,
        status: u32,
    },
    Data {
        id: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// SETTINGS, HEADERS, WINDOW_UPDATE and the like: nothing to do for them here.
    Other(u16),
}

/// One end's header compression: a zlib stream for the whole connection each way.
pub struct Codec {
    deflate: Compress,
    inflate: Decompress,
}

impl Default for Codec {
    fn default() -> Self {
        let mut deflate = Compress::new(Compression::best(), true);
        deflate
            .set_dictionary(DICTIONARY)
            .expect("a fresh compressor takes a dictionary");
        Codec {
            deflate,
            inflate: Decompress::new(true),
        }
    }
}

impl Codec {
    /// A frame's bytes.
    pub fn encode(&mut self, frame: &Frame) -> Vec<u8> {
        match frame {
            Frame::Data { id, fin, data } => {
                let mut bytes = (id & 0x7fff_ffff).to_be_bytes().to_vec();
                bytes.extend(flags_and_length(*fin, data.len()));
                bytes.extend_from_slice(data);
                bytes
            }
            Frame::SynStream { id, fin, headers } => {
                let mut body = id.to_be_bytes().to_vec();
                body.extend([0; 6]);
                body.extend(self.deflate_headers(headers));
                control(SYN_STREAM, *fin, &body)
            }
            Frame::SynReply { id, headers } => {
                let mut body = id.to_be_bytes().to_vec();
                body.extend(self.deflate_headers(headers));
                control(SYN_REPLY, false, &body)
            }
            Frame::RstStream { id, status } => control(
                RST_STREAM,
                false,
                &[id.to_be_bytes(), status.to_be_bytes()].concat(),
            ),
            Frame::Ping(id) => control(PING, false, &id.to_be_bytes()),
            Frame::GoAway { last, status } => control(
                GOAWAY,
                false,
                &[last.to_be_bytes(), status.to_be_bytes()].concat(),
            ),
            Frame::Other(kind) => control(*kind, false, &[]),
        }
    }

    /// The next frame of `input`; None at its end.
    pub async fn read<R: AsyncRead + Unpin>(
        &mut self,
        input: &mut R,
    ) -> Result<Option<Frame>, String> {
        let mut head = [0u8; 8];
        match input.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.to_string()),
        }
        let flags = head[4];
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut body = vec![0u8; length.min(MAX_FRAME)];
        input
            .read_exact(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        let fin = flags & FLAG_FIN != 0;
        let word = |at: usize| -> Result<u32, String> {
            body.get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| format!("a frame of {length} bytes is too short"))
        };
        if head[0] & 0x80 == 0 {
            let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            return Ok(Some(Frame::Data {
                id,
                fin,
                data: body,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(format!(
                "SPDY version {version} is not spoken, only {VERSION}"
            ));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        Ok(Some(match kind {
            SYN_STREAM => Frame::SynStream {
                id: word(0)? & 0x7fff_ffff,
                fin,
                headers: self.inflate_headers(body.get(10..).unwrap_or_default())?,
            },
            SYN_REPLY => Frame::SynReply {
                id: word(0)? & 0x7fff_ffff,
                headers: self.inflate_headers(body.get(4..).unwrap_or_default())?,
            },
            RST_STREAM => Frame::RstStream {
                id: word(0)? & 0x7fff_ffff,
                status: word(4)?,
            },
            PING => Frame::Ping(word(0)?),
            GOAWAY => Frame::GoAway {
                last: word(0)? & 0x7fff_ffff,
                status: word(4)?,
            },
            other => Frame::Other(other),
        }))
    }

    fn deflate_headers(&mut self, headers: &[(String, String)]) -> Vec<u8> {
        let mut plain = (headers.len() as u32).to_be_bytes().to_vec();
        for (name, value) in headers {
            for text in [name.to_ascii_lowercase().as_str(), value] {
                plain.extend((text.len() as u32).to_be_bytes());
                plain.extend_from_slice(text.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = plain.as_slice();
        loop {
            out.reserve(256);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .expect("compressing into memory");
            input = &input[(self.deflate.total_in() - before) as usize..];
            // Flushed once the compressor leaves room in the output.
            if input.is_empty() && out.len() < out.capacity() {
                return out;
            }
        }
    }

    fn inflate_headers(&mut self, mut input: &[u8]) -> Result<Vec<(String, String)>, String> {
        let mut plain = Vec::with_capacity(input.len() * 4);
        loop {
            plain.reserve(4096);
            let before = self.inflate.total_in();
            match self
                .inflate
                .decompress_vec(input, &mut plain, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| format!("the header dictionary: {e}"))?;
                }
                Err(e) => return Err(format!("a header block does not inflate: {e}")),
            }
            input = &input[(self.inflate.total_in() - before) as usize..];
            if input.is_empty() && plain.len() < plain.capacity() {
                break;
            }
        }
        parse_headers(&plain)
    }
}

fn flags_and_length(fin: bool, length: usize) -> [u8; 4] {
    let mut bytes = (length as u32).to_be_bytes();
    bytes[0] = if fin { FLAG_FIN } else { 0 };
    bytes
}

fn control(kind: u16, fin: bool, body: &[u8]) -> Vec<u8> {
    let mut bytes = (0x8000 | VERSION).to_be_bytes().to_vec();
    bytes.extend(kind.to_be_bytes());
    bytes.extend(flags_and_length(fin, body.len()));
    bytes.extend_from_slice(body);
    bytes
}

/// A header block: a count, then each name and value with its length.
fn parse_headers(mut block: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut take = |n: usize| -> Result<&[u8], String> {
        if block.len() < n {
            return Err("a header block ends early".into());
        }
        let (head, rest) = block.split_at(n);
        block = rest;
        Ok(head)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = word(take(4)?);
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let length = word(take(4)?);
        let name = String::from_utf8_lossy(take(length)?).into_owned();
        let length = word(take(4)?);
        let value = String::from_utf8_lossy(take(length)?).into_owned();
        headers.push((name, value));
    }
    Ok(headers)
}

/// A stream the client opened: its headers, the data it sends (ending at its FIN or reset),
/// and the way back.
pub struct Stream {
    pub id: u32,
    pub headers: Vec<(String, String)>,
    pub data: mpsc::Receiver<Vec<u8>>,
    pub writer: StreamWriter,
}

impl Stream {
    /// A header's value; names are lower case on the wire.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The server's side of a stream: data to the client, then its FIN.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    frames: mpsc::Sender<Frame>,
}

impl StreamWriter {
    /// Sends `data`; false once the connection is gone.
    pub async fn send(&self, data: &[u8]) -> bool {
        self.frames
            .send(Frame::Data {
                id: self.id,
                fin: false,
                data: data.to_vec(),
            })
            .await
            .is_ok()
    }

    /// Half-closes the stream: the client reads its end.
    pub async fn finish(&self) {
        let _ = self
            .frames
            .send(Frame::Data {
                id: self.id,
                fin: true,
                data: vec![],
            })
            .await;
    }
}

/// Ends a connection that `serve` serves.
pub struct Closer {
    frames: mpsc::Sender<Frame>,
}

impl Closer {
    /// Ends the connection after what was sent before: a GOAWAY, then the end of the bytes.
    pub async fn close(self) {
        let _ = self.frames.send(Frame::GoAway { last: 0, status: 0 }).await;
    }
}

/// Serves SPDY on `io` until the client goes or the connection is closed: each stream the
/// client opens arrives on the receiver once replied to; the receiver ends when the client
/// is gone.
pub fn serve<IO>(io: IO) -> (mpsc::Receiver<Stream>, Closer)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut input, mut output) = tokio::io::split(io);
    let (frames, mut outgoing) = mpsc::channel::<Frame>(64);
    let (streams, accepted) = mpsc::channel::<Stream>(16);
    // The protocol has one zlib stream a direction: the writer compresses, the reader
    // inflates, each with a codec of its own.
    tokio::spawn(async move {
        let mut codec = Codec::default();
        let mut last = 0;
        while let Some(frame) = outgoing.recv().await {
            let frame = match frame {
                Frame::SynReply { id, .. } => {
                    last = id;
                    frame
                }
                Frame::GoAway { status, .. } => {
                    let _ = output
                        .write_all(&codec.encode(&Frame::GoAway { last, status }))
                        .await;
                    break;
                }
                frame => frame,
            };
            if output.write_all(&codec.encode(&frame)).await.is_err() {
                return;
            }
        }
        let _ = output.shutdown().await;
    });
    let replies = frames.clone();
    tokio::spawn(async move {
        let frames = replies;
        let mut codec = Codec::default();
        let mut open: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
        loop {
            let frame = match codec.read(&mut input).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, "SPDY connection ends");
                    break;
                }
            };
            match frame {
                Frame::SynStream { id, fin, headers } => {
                    let (sender, data) = mpsc::channel(16);
                    if !fin {
                        open.insert(id, sender);
                    }
                    let reply = Frame::SynReply {
                        id,
                        headers: vec![],
                    };
                    if frames.send(reply).await.is_err() {
                        break;
                    }
                    let stream = Stream {
                        id,
                        headers,
                        data,
                        writer: StreamWriter {
                            id,
                            frames: frames.clone(),
                        },
                    };
                    if streams.send(stream).await.is_err() {
                        break;
                    }
                }
                Frame::Data { id, fin, data } => {
                    if let Some(sender) = open.get(&id)
                        && !data.is_empty()
                        && sender.send(data).await.is_err()
                    {
                        open.remove(&id);
                    }
                    if fin {
                        open.remove(&id);
                    }
                }
                Frame::RstStream { id, .. } => {
                    open.remove(&id);
                }
                // A client's ping has an odd ID; the server answers it.
                Frame::Ping(id) if id % 2 == 1 && frames.send(Frame::Ping(id)).await.is_err() => {
                    break;
                }
                Frame::GoAway { .. } => break,
                _ => {}
            }
        }
        // The client is gone: the data of its streams ends.
    });
    (accepted, Closer { frames })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_protocols() {
        assert_eq!(DICTIONARY.len(), 1423);
        // zlib names a dictionary by its Adler-32: the one SPDY/3 implementations expect.
        let mut deflate = Compress::new(Compression::best(), true);
        assert_eq!(deflate.set_dictionary(DICTIONARY).unwrap(), 0xe3c6_a7c2);
    }

    #[tokio::test]
    async fn frames_and_compressed_headers_survive_a_round_trip() {
        let mut client = Codec::default();
        let mut server = Codec::default();
        let frames = [
            Frame::SynStream {
                id: 1,
                fin: false,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("port".into(), "8080".into()),
                ],
            },
            Frame::SynStream {
                id: 3,
                fin: true,
                headers: vec![("streamtype".into(), "data".into())],
            },
            Frame::Data {
                id: 3,
                fin: true,
                data: b"hello".to_vec(),
            },
            Frame::Ping(7),
            Frame::RstStream { id: 3, status: 5 },
            Frame::GoAway { last: 3, status: 0 },
        ];
        let mut wire = vec![];
        for frame in &frames {
            wire.extend(client.encode(frame));
        }
        let mut reader = wire.as_slice();
        for frame in &frames {
            assert_eq!(
                server.read(&mut reader).await.unwrap().as_ref(),
                Some(frame)
            );
        }
        assert_eq!(server.read(&mut reader).await.unwrap(), None);
    }
}

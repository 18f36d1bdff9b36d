//! A counting fake `Backend`: builds are closures that count and fail on demand. It lets the cache and
//! runtime layers be tested without a driver; the real backends are tested on real drivers elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kpc::BackendKind;
use kpc::admin::backend::{Backend, DeviceFingerprint, KernelObject};
use kpc::admin::backend::{DynKernel, DynProgram};
use kpc::admin::cache::CacheCost;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{DeviceImage, ImageFormat, KernelInfo};
use kpc::{Error, Result};
use parking_lot::Mutex;

/// Decides the fate of the N-th build (0-based): `None` builds, `Some(e)` fails with `e`.
pub type FailFn = dyn Fn(usize, &DeviceImage) -> Option<Error> + Send + Sync;

/// A "compiled" fake program: what it was built from, so tests can check each program got its own inputs.
#[derive(Debug)]
pub struct FakeProgram {
    pub image: String,
    /// Spec constant 0's value if it is a U32 (the fake "computes" with it).
    pub spec0: Option<u32>,
    pub options: String,
    pub binary: Vec<u8>,
    /// Which build (0-based) produced it.
    pub serial: usize,
    pub from_disk: bool,
    pub entries: Vec<String>,
}

impl CacheCost for FakeProgram {
    fn cache_bytes(&self) -> u64 {
        self.binary.len() as u64
    }
}

#[derive(Debug)]
pub struct FakeKernel {
    pub program: Arc<FakeProgram>,
    pub entry: String,
    /// What it describes itself as: its entry point, no parameters, a local size of one.
    pub info: KernelInfo,
}

impl KernelObject for FakeKernel {
    fn info(&self) -> &KernelInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The fake's own objects behind the manager's erased handles.
pub trait AsFake {
    /// The fake type inside.
    type Fake;
    /// The fake object; panics when it is not one (a test bug).
    fn fake(&self) -> &Self::Fake;
}

impl AsFake for DynKernel {
    type Fake = FakeKernel;
    fn fake(&self) -> &FakeKernel {
        self.downcast_ref::<FakeKernel>()
            .expect("a kernel of the fake backend")
    }
}

impl AsFake for kpc::admin::runtime::ProgramManager {
    type Fake = FakeBackend;
    fn fake(&self) -> &FakeBackend {
        self.backend_as::<FakeBackend>()
            .expect("a manager over the fake backend")
    }
}

impl AsFake for DynProgram {
    type Fake = FakeProgram;
    fn fake(&self) -> &FakeProgram {
        self.downcast_ref::<FakeProgram>()
            .expect("a program of the fake backend")
    }
}

impl FakeKernel {
    /// The fake kernel's "computation": x * spec0 (or x when unspecialized).
    pub fn run(&self, x: u32) -> u32 {
        x * self.program.spec0.unwrap_or(1)
    }
}

pub struct FakeBackend {
    fingerprint: DeviceFingerprint,
    pub builds: AtomicUsize,
    pub binary_loads: AtomicUsize,
    pub kernels_created: AtomicUsize,
    /// Bytes of every fake binary (padding makes programs weigh what a test wants).
    pub binary_size: usize,
    pub build_delay: Duration,
    fail: Mutex<Option<Arc<FailFn>>>,
    /// While set, `program_from_binary` refuses every binary (a driver that changed under the cache).
    pub reject_binaries: AtomicBool,
    /// While set, `program_binary` returns `None` (nothing worth persisting).
    pub no_binary: AtomicBool,
    /// While set, `program_binary` fails.
    pub binary_error: AtomicBool,
    /// This many of the next `program_from_binary` calls fail with out-of-resources (OpenCL's -5).
    pub oom_loads: AtomicUsize,
    /// `program_from_binary` of the image with this name aborts the process: a driver that crashes
    /// on one stored binary.
    pub abort_loading: Mutex<Option<String>>,
    /// Where set, every build parks here until the test releases it.
    pub gate: Option<Arc<BuildGate>>,
}

/// Holds fake builds until the test lets them go, so that a test orders builds against its own
/// steps by counts instead of by sleeping: [`BuildGate::wait_parked`] waits until builds are parked
/// at it, [`BuildGate::release`] lets the parked ones go (later builds park again).
#[derive(Default)]
pub struct BuildGate {
    state: Mutex<GateState>,
    changed: parking_lot::Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    released: usize,
    order: Vec<String>,
}

impl BuildGate {
    fn pass(&self, image: &str) {
        let mut s = self.state.lock();
        let me = s.arrived;
        s.arrived += 1;
        s.order.push(image.to_string());
        self.changed.notify_all();
        while s.released <= me {
            self.changed.wait(&mut s);
        }
    }
    /// Builds that reached the gate so far, released or not.
    pub fn arrived(&self) -> usize {
        self.state.lock().arrived
    }
    /// The image names of the builds that reached the gate, in the order they did.
    pub fn order(&self) -> Vec<String> {
        self.state.lock().order.clone()
    }
    /// Builds parked at the gate now.
    pub fn parked(&self) -> usize {
        let s = self.state.lock();
        s.arrived - s.released
    }
    /// Waits (a minute at most, then fails the test) until at least `n` builds are parked.
    pub fn wait_parked(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut s = self.state.lock();
        while s.arrived - s.released < n {
            assert!(
                !self.changed.wait_until(&mut s, deadline).timed_out(),
                "{} builds parked, waited for {n}",
                s.arrived - s.released
            );
        }
    }
    /// Lets every parked build go on.
    pub fn release(&self) {
        let mut s = self.state.lock();
        s.released = s.arrived;
        self.changed.notify_all();
    }
}

pub const MAGIC: &[u8] = b"FAKEBIN1";

impl FakeBackend {
    pub fn new() -> Self {
        Self::with_device("fake-device-0")
    }
    pub fn with_device(name: &str) -> Self {
        FakeBackend {
            fingerprint: DeviceFingerprint::new(
                BackendKind::Vulkan,
                vec![
                    ("deviceName".into(), name.into()),
                    ("driverVersion".into(), "1".into()),
                ],
            ),
            builds: AtomicUsize::new(0),
            binary_loads: AtomicUsize::new(0),
            kernels_created: AtomicUsize::new(0),
            binary_size: 64,
            build_delay: Duration::ZERO,
            fail: Mutex::new(None),
            reject_binaries: AtomicBool::new(false),
            no_binary: AtomicBool::new(false),
            binary_error: AtomicBool::new(false),
            oom_loads: AtomicUsize::new(0),
            abort_loading: Mutex::new(None),
            gate: None,
        }
    }
    /// A fake device named `name` whose fingerprint reports driver version `driver` (the default is
    /// "1"): what a driver update looks like to the cache.
    pub fn with_driver_version(name: &str, driver: &str) -> Self {
        let mut b = Self::with_device(name);
        b.fingerprint = DeviceFingerprint::new(
            BackendKind::Vulkan,
            vec![
                ("deviceName".into(), name.into()),
                ("driverVersion".into(), driver.into()),
            ],
        );
        b
    }
    pub fn binary_size(mut self, n: usize) -> Self {
        self.binary_size = n.max(MAGIC.len() + 8);
        self
    }
    /// Every build parks at `gate` until the test releases it.
    pub fn gated(mut self, gate: Arc<BuildGate>) -> Self {
        self.gate = Some(gate);
        self
    }
    pub fn build_delay(mut self, d: Duration) -> Self {
        self.build_delay = d;
        self
    }
    pub fn fail_with(
        &self,
        f: impl Fn(usize, &DeviceImage) -> Option<Error> + Send + Sync + 'static,
    ) {
        *self.fail.lock() = Some(Arc::new(f));
    }
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::SeqCst)
    }

    fn binary_for(&self, image: &DeviceImage, spec0: Option<u32>) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&spec0.unwrap_or(u32::MAX).to_le_bytes());
        b.extend_from_slice(&image.digest().0[..4]);
        b.resize(self.binary_size, 0xAB);
        b
    }
}

/// An OpenCL-C-flavoured fake image whose entry points are listed as `kernel NAME` lines.
pub fn image(name: &str, entries: &[&str]) -> DeviceImage {
    let text: String = entries.iter().map(|e| format!("kernel {e}\n")).collect();
    DeviceImage::new(
        name,
        ImageFormat::OpenClC,
        format!("// {name}\n{text}").into_bytes(),
    )
}

/// Acquires the numbered program `k{i}.cl` (options `-O2`) through `pm`: the keys the store tests
/// count and look for, each a distinct entry.
pub fn program(pm: &kpc::admin::runtime::ProgramManager, i: usize) -> kpc::Source {
    let img = image(&format!("k{i}.cl"), &["main"]);
    pm.program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
        .unwrap()
        .source
}

/// The store key of [`program`]`(pm, i)`.
pub fn key(pm: &kpc::admin::runtime::ProgramManager, i: usize) -> kpc::StoreKey {
    pm.disk_key(
        &image(&format!("k{i}.cl"), &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    )
}

fn entries_of(image: &DeviceImage) -> Vec<String> {
    String::from_utf8_lossy(image.bytes())
        .lines()
        .filter_map(|l| l.strip_prefix("kernel "))
        .map(str::to_string)
        .collect()
}

fn spec0(spec: &SpecConstants) -> Option<u32> {
    spec.iter()
        .find(|(id, _)| *id == 0)
        .and_then(|(_, v)| match v {
            SpecValue::U32(x) => Some(*x),
            _ => None,
        })
}

impl Backend for FakeBackend {
    type Program = FakeProgram;
    type Kernel = FakeKernel;

    fn kind(&self) -> BackendKind {
        BackendKind::Vulkan
    }
    fn fingerprint(&self) -> &DeviceFingerprint {
        &self.fingerprint
    }
    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<FakeProgram> {
        let n = self.builds.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.pass(image.name());
        }
        if !self.build_delay.is_zero() {
            std::thread::sleep(self.build_delay);
        }
        let fail = self.fail.lock().clone();
        if let Some(e) = fail.and_then(|f| f(n, image)) {
            return Err(e);
        }
        Ok(FakeProgram {
            image: image.name().to_string(),
            spec0: spec0(spec),
            options: options.as_str().to_string(),
            binary: self.binary_for(image, spec0(spec)),
            serial: n,
            from_disk: false,
            entries: entries_of(image),
        })
    }
    fn program_binary(&self, program: &FakeProgram) -> Result<Option<Vec<u8>>> {
        if self.binary_error.load(Ordering::SeqCst) {
            return Err(Error::Backend {
                backend: BackendKind::Vulkan,
                call: "vkGetPipelineCacheData",
                code: -1,
            });
        }
        if self.no_binary.load(Ordering::SeqCst) {
            return Ok(None);
        }
        Ok(Some(program.binary.clone()))
    }
    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<FakeProgram> {
        self.binary_loads.fetch_add(1, Ordering::SeqCst);
        if self.abort_loading.lock().as_deref() == Some(image.name()) {
            eprintln!("fake driver: crashing while loading {}", image.name());
            std::process::abort();
        }
        let oom = self
            .oom_loads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if oom.is_ok() {
            return Err(Error::OutOfResources {
                backend: BackendKind::OpenCl,
                code: -5,
                message: "CL_OUT_OF_RESOURCES (injected)".into(),
            });
        }
        if self.reject_binaries.load(Ordering::SeqCst) {
            return Err(Error::Backend {
                backend: BackendKind::Vulkan,
                call: "vkCreatePipelineCache",
                code: -3,
            });
        }
        if binary != self.binary_for(image, spec0(spec)).as_slice() {
            return Err(Error::InvalidArgument(
                "fake binary does not match its key".into(),
            ));
        }
        Ok(FakeProgram {
            image: image.name().to_string(),
            spec0: spec0(spec),
            options: options.as_str().to_string(),
            binary: binary.to_vec(),
            serial: usize::MAX,
            from_disk: true,
            entries: entries_of(image),
        })
    }
    fn create_kernel(&self, program: &Arc<FakeProgram>, entry: &str) -> Result<FakeKernel> {
        self.kernels_created.fetch_add(1, Ordering::SeqCst);
        if !program.entries.iter().any(|e| e == entry) {
            return Err(Error::UnknownKernel {
                image: program.image.clone(),
                entry: entry.to_string(),
                available: program.entries.join(", "),
            });
        }
        Ok(FakeKernel {
            program: program.clone(),
            entry: entry.to_string(),
            info: KernelInfo::new(entry, [1, 1, 1]),
        })
    }
}
